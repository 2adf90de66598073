"""Fabric's precision plugin: autocast on the backend's device type, a scaler for float16."""

from __future__ import annotations

from typing import Any, Literal

import torch
from lightning.fabric.plugins.precision import MixedPrecision, Precision
from lightning_utilities.core.apply_func import apply_to_collection

from ..._protocol import Accelerator
from ..._resolve import resolve_backend
from ._mapping import BackendMapping

__all__ = ["AccelFabricPrecision", "fabric_precision_plugin"]


class AccelFabricPrecision(MixedPrecision):
    """Fabric's ``MixedPrecision`` on an accel backend's device type.

    Autocasts on ``device`` (``backend.device_type``; Fabric itself would autocast on
    ``"cuda"`` for any accelerator it does not know) and, for ``"16-mixed"``, scales the
    loss with a ``torch.amp.GradScaler`` for that device. Like Fabric's, it casts the
    floating-point inputs of a set-up module to the autocast dtype, but only those on
    ``device``'s type: autocast does not reach tensors elsewhere (the host, under an
    accel strategy given a host device), which stay as they are.

    Args:
        precision: ``"bf16-mixed"`` or ``"16-mixed"``.
        device: The device type to autocast on.
        scaler: A ``torch.amp.GradScaler``; default, one for ``device`` with ``16-mixed``.
    """

    def __init__(
        self,
        precision: Literal["16-mixed", "bf16-mixed"],
        device: str,
        scaler: torch.amp.GradScaler | None = None,
    ) -> None:
        super().__init__(precision, device, scaler)

    def convert_input(self, data: Any) -> Any:
        """Cast floating-point tensors on the autocast device type to the autocast dtype."""
        dtype = self._desired_input_dtype
        return apply_to_collection(
            data,
            function=lambda t: t.to(dtype) if self._casts(t) else t,
            dtype=torch.Tensor,
        )

    def _casts(self, tensor: torch.Tensor) -> bool:
        return tensor.is_floating_point() and tensor.device.type == self.device


def fabric_precision_plugin(
    backend: str | Accelerator | None = None, precision: Any = "32-true"
) -> Precision:
    """Return Fabric's precision plugin for ``precision`` on ``backend``'s device.

    The Fabric counterpart of :func:`precision_plugin`, with the same arguments and
    errors: Fabric's plain ``Precision`` for ``"32-true"``, an
    :class:`AccelFabricPrecision` autocasting on ``backend.device_type`` for
    ``"bf16-mixed"`` and ``"16-mixed"``.

    Args:
        backend: A backend name, a backend object, or ``None`` for ``accel.get_backend()``.
        precision: As for :func:`precision_plugin` (``"32-true"``, ``"bf16-mixed"``,
            ``"16-mixed"`` and their aliases).

    Raises:
        LightningSetupError: See :func:`precision_plugin`.
    """
    mapping = BackendMapping(resolve_backend(backend, "accel.integrations.lightning"), "Fabric")
    mixed = mapping.mixed_precision(precision)
    if mixed is None:
        return Precision()
    return AccelFabricPrecision(mixed, mapping.autocast_device_type)
