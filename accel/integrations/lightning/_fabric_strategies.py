"""Fabric's single-device and DDP strategies: the backend's device, collectives and steps.

Fabric routes ``fabric.backward(loss)`` through ``strategy.backward`` and every
``optimizer.step()`` of a set-up optimizer through ``strategy.optimizer_step``; both
strategies end the step there (``backend.mark_step()``, see
:meth:`~._mapping.BackendMapping.end_of_step`). Because they override ``backward``,
Fabric refuses a bare ``loss.backward()`` on a set-up module's output, as it does for
its own plugins that need ``fabric.backward``: on a lazy backend that call would skip
the graph cut.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from lightning.fabric.plugins.precision import MixedPrecision, Precision
from lightning.fabric.strategies.ddp import DDPStrategy
from lightning.fabric.strategies.single_device import SingleDeviceStrategy
from lightning.fabric.strategies.strategy import Strategy
from lightning.fabric.utilities.types import Optimizable
from torch.nn import Module
from torch.optim import Optimizer
from torch.utils.weak import WeakIdKeyDictionary

from ._bound import DDPOnBackend, OnBackend, SingleDeviceOnBackend
from ._fabric_precision import AccelFabricPrecision
from ._mapping import Front, Mixed

__all__ = ["AccelFabricDDPStrategy", "AccelFabricSingleDeviceStrategy"]


class _FabricStepBoundaries(OnBackend, Strategy):
    """``mark_step`` where Fabric's step ends, and precision on the backend's device type."""

    _front: ClassVar[Front] = "Fabric"

    @property
    def precision(self) -> Precision:
        """The precision plugin (Fabric's ``MixedPrecision`` is moved to the backend's device)."""
        return self._precision if self._precision is not None else Precision()

    @precision.setter
    def precision(self, precision: Precision | None) -> None:
        # Fabric builds MixedPrecision(device="cuda") for precision="bf16-mixed" with an
        # accelerator it does not know; the same precision on the backend's device type.
        device = self.mapping.autocast_device_type
        if type(precision) is MixedPrecision and precision.device != device:
            half: Mixed = "16-mixed" if precision.precision == "16-mixed" else "bf16-mixed"
            precision = AccelFabricPrecision(half, device)
        self._precision = precision

    def module_to_device(self, module: Module) -> None:
        """Move ``module`` to the root device, noting parameters the move replaced.

        On devices whose tensors cannot take a host tensor's place (XLA), ``Module.to``
        makes new parameters, so an optimizer built before ``fabric.setup`` would still
        step the host ones; :meth:`setup_optimizer` points it at the new ones (Fabric
        does this only for its own XLA strategies).
        """
        before = dict(module.named_parameters())
        super().module_to_device(module)  # type: ignore[safe-super]
        after = dict(module.named_parameters())
        if not hasattr(self, "_replaced"):  # host parameter -> its device replacement
            self._replaced: WeakIdKeyDictionary = WeakIdKeyDictionary()
        for name, old in before.items():
            if after.get(name) is not old:
                self._replaced[old] = after[name]

    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        """Point ``optimizer`` at the parameters :meth:`module_to_device` put in place."""
        replaced = getattr(self, "_replaced", None)
        if replaced:
            for group in optimizer.param_groups:
                group["params"] = [replaced.get(p, p) for p in group["params"]]
            for old in [p for p in optimizer.state if p in replaced]:
                optimizer.state[replaced[old]] = optimizer.state.pop(old)
        return super().setup_optimizer(optimizer)

    def backward(
        self, tensor: torch.Tensor, module: Module | None, *args: Any, **kwargs: Any
    ) -> None:
        """Run backward through the precision plugin, then flush it (``backend.mark_step()``)."""
        super().backward(tensor, module, *args, **kwargs)
        self.mapping.end_of_step()

    def optimizer_step(self, optimizer: Optimizable, **kwargs: Any) -> Any:
        """Step the optimizer, then flush the update (``backend.mark_step()``)."""
        result = super().optimizer_step(optimizer, **kwargs)
        self.mapping.end_of_step()
        return result


class AccelFabricSingleDeviceStrategy(
    _FabricStepBoundaries, SingleDeviceOnBackend, SingleDeviceStrategy
):
    """Fabric's single-device strategy on an accel backend's device.

    Registered in Fabric's registry as ``strategy="accel_single_device"``.

    Args:
        backend: A backend name, a backend object, or ``None`` for ``accel.get_backend()``.
        device: The device to train on; default ``backend.device()``. A device of another
            type (the host, for a backend whose device torch cannot allocate here) keeps
            every step boundary and the autocast on the backend.
        **kwargs: Passed to Fabric's ``SingleDeviceStrategy`` (``checkpoint_io``, ...).
    """


class AccelFabricDDPStrategy(_FabricStepBoundaries, DDPOnBackend, DDPStrategy):
    """Fabric's DDP on an accel backend: its collectives, no CUDA streams.

    Registered in Fabric's registry as ``strategy="accel_ddp"``. The process group uses
    ``backend.communication_backend`` (``gloo``, ``nccl``, ``hccl``...) after
    ``backend.prepare_distributed()``; the module is wrapped in
    ``DistributedDataParallel`` without ``device_ids`` (DDP takes the module's device)
    and so without the side CUDA stream Fabric 2.6 creates for any non-CPU device.
    Processes come from ``torchrun`` (or another cluster environment) or from
    ``fabric.launch()``, as with Fabric's ``"ddp"``.

    Args:
        backend: A backend name, a backend object, or ``None`` for ``accel.get_backend()``.
        **kwargs: Passed to Fabric's ``DDPStrategy`` (``process_group_backend`` overrides
            the backend's, ``timeout``, ``start_method``, ``find_unused_parameters``...).
    """

    def _determine_ddp_device_ids(self) -> list[int] | None:
        return None  # DDP takes the device from the module, on every backend
