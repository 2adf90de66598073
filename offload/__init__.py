"""Train models larger than device memory, with transfers overlapped with compute.

Everything here talks to the device only through the :class:`accel.Accelerator`
protocol, so the same code runs on every backend: copies go on a copy stream made with
``backend.Stream()`` and are ordered with events, page-locked host memory comes from
``backend.empty_pinned``, and ``backend.mark_step()`` flushes lazy graphs. On a backend
without streams the copies simply run in order; when the device is the host nothing is
copied at all. On a device whose tensors cannot take a host tensor's place (a lazy-tensor
runtime's), parameters reach the device as differentiable copies (:mod:`offload._core.copies`).

Example::

    from offload import Engine, OffloadModel

    model = OffloadModel(nn.Sequential(*blocks), num_slices=4, checkpoint_activation=True)
    optimizer = torch.optim.AdamW(model.parameters())       # steps on the host
    engine = Engine(model, optimizer, gradient_accumulation_steps=2)
    engine.backward(criterion(engine(x), y))
    engine.step()

Public names:

* :class:`OffloadModel`: a sequential model split into slices that visit the device one
  at a time, the next one loading while the current one computes (fairscale's
  constructor);
* :func:`offload_parameters` and its handle :class:`ParameterOffload`: any model, each
  submodule's parameters loaded when it runs, driven by forward and backward hooks; in
  force until :meth:`ParameterOffload.remove` (:meth:`ParameterOffload.of` finds it);
* :class:`Engine`: backward with gradient accumulation and loss scaling, and the step
  with gradient clipping and an LR scheduler; :class:`LossScaler` scales losses for
  gradients that live on the host;

Both wrappers handle tied weights (a parameter used by several parts is loaded with
each and its gradient sums their uses) and hand out gradients that later steps never
rewrite.
* :class:`State`: the training states every offloaded unit goes through;
* :class:`OffloadError` and its subclasses.
"""

from __future__ import annotations

from ._engine import Engine
from ._errors import OffloadConfigError, OffloadError, OffloadStateError, UnsupportedModelError
from ._model.offload_model import OffloadModel
from ._params.offload_parameters import ParameterOffload, offload_parameters
from ._scaler import LossScaler
from ._state import State

__all__ = [
    "Engine",
    "LossScaler",
    "OffloadConfigError",
    "OffloadError",
    "OffloadModel",
    "OffloadStateError",
    "ParameterOffload",
    "State",
    "UnsupportedModelError",
    "offload_parameters",
]
