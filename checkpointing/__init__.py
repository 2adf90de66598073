"""Activation checkpointing that gives the plain run's results on every backend.

Drop-in for ``torch.utils.checkpoint``, written only against the
:class:`accel.Accelerator` protocol: dropout is replayed exactly (host and device
generators), autocast is replayed (device and host), each recomputation's inputs pass
the backend's recompute barrier (:func:`accel.recompute_barrier`: an optimisation
barrier on a compiling lazy device, ``backend.mark_step()`` on backends without one),
and modules with running statistics do not update them twice.

Example::

    from checkpointing import checkpoint

    out = checkpoint(block, hidden, use_reentrant=False)   # instead of torch's
    out.sum().backward()

Public names:

* :func:`checkpoint` and :func:`checkpoint_sequential`: torch's signatures, plus
  ``backend=`` (a backend or its name; default :func:`accel.get_backend`);
* :func:`checkpoint_wrapper` and :func:`apply_activation_checkpointing`: checkpoint
  submodules in place, optionally keeping their inputs in host memory
  (``offload_to_cpu``);
* :func:`plan_checkpointing` and :class:`CheckpointPlan`: the fastest checkpointing
  that fits a memory budget, decided from shapes and a cost model (also
  ``apply_activation_checkpointing(model, memory_budget=0.5, example_inputs=(x,))``);
  a plan saves to JSON and loads back; :func:`profile_step` records a step once
  (a :class:`RecordedStep`, no rate in it) for several plans (``profile=``);
  :class:`DeviceRates`, :func:`default_rates`
  and :func:`calibrate_rates`: the cost model's inputs (:mod:`checkpointing.planner`);
  :class:`PlanMeasurement`: one real step under a plan beside its figures
  (``plan.measure(model, example_inputs)``, to run once on a new device);
  :class:`PerCallWrapper`: what a plan puts around a module it checkpoints call by call;
* :func:`is_recomputing`: whether this thread is re-running a checkpointed function;
* :class:`CheckpointError`: a recomputation that does not match its forward (torch's
  ``torch.utils.checkpoint.CheckpointError``, re-exported);
* :func:`set_checkpoint_debug_enabled` and :func:`set_checkpoint_early_stop`: torch's
  global switches, re-exported; they apply to the non-reentrant variant here too;
* :class:`SavedTensorMeter`: the bytes autograd keeps for backward, on any device;
  :class:`LiveActivationMeter`: the bytes a forward created that are still alive
  (what autograd saves and what a selective checkpoint keeps outside autograd).
"""

from __future__ import annotations

import torch.utils.checkpoint

from ._apply import apply_activation_checkpointing
from ._checkpoint import checkpoint
from ._errors import CheckpointError
from ._measure import LiveActivationMeter, SavedTensorMeter
from ._per_call import PerCallWrapper
from ._sequential import checkpoint_sequential
from ._state import is_recomputing
from ._wrapper import CheckpointWrapper, checkpoint_wrapper
from .planner import (
    CheckpointPlan,
    Decision,
    DeviceRates,
    PlanMeasurement,
    RecordedStep,
    calibrate_rates,
    default_rates,
    plan_checkpointing,
    profile_step,
)

# torch's own global switches: the non-reentrant variant runs torch's checkpoint.
set_checkpoint_debug_enabled = torch.utils.checkpoint.set_checkpoint_debug_enabled
"""torch's ``torch.utils.checkpoint.set_checkpoint_debug_enabled``, re-exported.

A context manager: ``with set_checkpoint_debug_enabled(True):`` makes every
non-reentrant checkpoint trace its operators, as ``debug=True`` does for one call.
"""
set_checkpoint_early_stop = torch.utils.checkpoint.set_checkpoint_early_stop
"""torch's ``torch.utils.checkpoint.set_checkpoint_early_stop``, re-exported.

A context manager: ``with set_checkpoint_early_stop(False):`` makes non-reentrant
recomputation run each function to its end instead of stopping once it has rebuilt the
saved tensors.
"""

__all__ = [
    "CheckpointError",
    "CheckpointPlan",
    "CheckpointWrapper",
    "Decision",
    "DeviceRates",
    "LiveActivationMeter",
    "PerCallWrapper",
    "PlanMeasurement",
    "RecordedStep",
    "SavedTensorMeter",
    "apply_activation_checkpointing",
    "calibrate_rates",
    "checkpoint",
    "checkpoint_sequential",
    "checkpoint_wrapper",
    "default_rates",
    "is_recomputing",
    "plan_checkpointing",
    "profile_step",
    "set_checkpoint_debug_enabled",
    "set_checkpoint_early_stop",
]
