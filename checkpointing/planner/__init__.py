"""The memory-budget planner: the fastest checkpointing that fits a memory budget.

:func:`plan_checkpointing` (``_planning``) runs these stages, one module each:

1. rates: the :class:`DeviceRates` given, else this host's cache of calibrated rates,
   else the built-in ones (``_default_rates``; the plan's note names a cache it read);
2. profile (:func:`profile_step`, or a ``profile=`` recorded earlier): one training
   step on fake tensors records, per module call, what autograd saves and every operator
   call's FLOPs by class and bytes, with no rate (``_profile``, ``_work``, into
   ``_records``); tensors laid out as the device's kernels lay them out (``_layouts``),
   attention run through the kernel the device would choose (``_kernels``), a model
   sharded with FSDP2 as each rank computes it (``_sharded``), no operator taken for
   one whose output the data shapes unless it is (``_data_shapes``), nothing of the fake
   step left behind (``_leftovers``), and each call's inputs checked against one real
   forward without grad (``_real_calls``);
3. cost: the recorded step priced at the rates (:func:`cost`, in ``_pricing``; the
   rates in ``_cost``), so that planning at other rates never profiles again;
4. options: each grain's ways to checkpoint each module call, with the bytes each keeps
   and the seconds it costs (``_grains``: one module per grain, each a named strategy
   that also owns its payload in the plan, its wrapper and its JSON; built on
   ``_options``, ``_saved_grain`` and ``_kept_ops``);
5. search: the combination that fits the budget in the least estimated time
   (``_search``);
6. plan: the :class:`CheckpointPlan` (``_plan``), which prints, saves (``_store``),
   loads, checks what it is applied to (``_signature``), applies (``_plan_apply``, each
   decision through its grain), and measures one real
   step against its figures (``_measure_step``);
7. agree: under ``torch.distributed`` every rank takes rank 0's plan (``_agree``).

On request only, ``_calibration`` measures a device's rates (:func:`calibrate_rates`)
and caches them for stage 1; its ``_stopwatch`` is the one module that reads a clock.
"""

from __future__ import annotations

from ._calibration import calibrate_rates
from ._cost import DeviceRates
from ._default_rates import default_rates, rates_cache_path
from ._grains import Decision
from ._measure_step import PlanMeasurement
from ._plan import CheckpointPlan, ConsideredPlan, PlanRow
from ._planning import plan_checkpointing, profile_step
from ._pricing import cost
from ._records import RecordedStep, StepProfile
from ._tables import HostProcessor, builtin_rates

__all__ = [
    "CheckpointPlan",
    "ConsideredPlan",
    "Decision",
    "DeviceRates",
    "HostProcessor",
    "PlanMeasurement",
    "PlanRow",
    "RecordedStep",
    "StepProfile",
    "builtin_rates",
    "calibrate_rates",
    "cost",
    "default_rates",
    "plan_checkpointing",
    "profile_step",
    "rates_cache_path",
]
