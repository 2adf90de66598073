"""The Trainer's single-device and DDP strategies: the backend's device, collectives, steps.

Both end Lightning's steps where :meth:`~._mapping.BackendMapping.end_of_step` says:
``backend.mark_step()`` after backward, after the optimizer step, and before every
validation, test and predict step (Gaudi's lazy mode and XLA flush their graph there; a
no-op on eager backends). Fabric's strategies are in :mod:`._fabric_strategies`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy, Strategy
from torch.nn.parallel import DistributedDataParallel

from ._bound import DDPOnBackend, OnBackend, SingleDeviceOnBackend

if TYPE_CHECKING:
    from torch.optim.optimizer import Optimizer

__all__ = ["AccelDDPStrategy", "AccelSingleDeviceStrategy"]


class _StepBoundaries(OnBackend, Strategy):
    """``mark_step`` at Lightning's step boundaries; shared by both strategies."""

    def post_backward(self, closure_loss: torch.Tensor) -> None:
        """Flush the backward graph (``backend.mark_step()``)."""
        super().post_backward(closure_loss)
        self.mapping.end_of_step()

    def optimizer_step(
        self,
        optimizer: Optimizer,
        closure: Any,
        model: Any = None,
        **kwargs: Any,
    ) -> Any:
        """Step the optimizer, then flush the update (``backend.mark_step()``)."""
        result = super().optimizer_step(optimizer, closure, model, **kwargs)
        self.mapping.end_of_step()
        return result

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        """Flush pending work (``backend.mark_step()``), then run the validation step."""
        self.mapping.end_of_step()
        return super().validation_step(*args, **kwargs)

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        """Flush pending work (``backend.mark_step()``), then run the test step."""
        self.mapping.end_of_step()
        return super().test_step(*args, **kwargs)

    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        """Flush pending work (``backend.mark_step()``), then run the predict step."""
        self.mapping.end_of_step()
        return super().predict_step(*args, **kwargs)


class AccelSingleDeviceStrategy(_StepBoundaries, SingleDeviceOnBackend, SingleDeviceStrategy):
    """Lightning's single-device strategy on an accel backend's device.

    Registered as ``strategy="accel_single_device"``.

    Args:
        backend: A backend name, a backend object, or ``None`` for ``accel.get_backend()``.
        device: The device to train on; default ``backend.device()``. A device of another
            type (the host, for a backend whose device torch cannot allocate here) keeps
            every step boundary, RNG and precision call on the backend.
        **kwargs: Passed to ``SingleDeviceStrategy`` (``checkpoint_io``, ...).
    """

    strategy_name = "accel_single_device"


class AccelDDPStrategy(_StepBoundaries, DDPOnBackend, DDPStrategy):
    """Lightning's DDP on an accel backend: its collectives, no CUDA streams.

    Registered as ``strategy="accel_ddp"``. The process group uses
    ``backend.communication_backend`` (``gloo``, ``nccl``, ``hccl``...) after
    ``backend.prepare_distributed()``; the model is wrapped in
    ``DistributedDataParallel`` without ``device_ids`` (DDP takes the module's device)
    and without the side CUDA stream Lightning 2.6 creates for any non-CPU device.

    Args:
        backend: A backend name, a backend object, or ``None`` for ``accel.get_backend()``.
        **kwargs: Passed to ``DDPStrategy`` (``process_group_backend`` overrides the
            backend's, ``timeout``, ``find_unused_parameters``...).
    """

    strategy_name = "accel_ddp"

    def determine_ddp_device_ids(self) -> list[int] | None:
        """Return ``None``: DDP takes the device from the module, on every backend."""
        return None

    def _setup_model(self, model: torch.nn.Module) -> DistributedDataParallel:
        return DistributedDataParallel(module=model, device_ids=None, **self._ddp_kwargs)
