"""The Trainer's precision plugin: autocast on the backend's device type, a scaler for float16."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.plugins.precision import MixedPrecision, Precision

from ..._protocol import Accelerator
from ..._resolve import resolve_backend
from ._mapping import BackendMapping

__all__ = ["precision_plugin"]


def precision_plugin(
    backend: str | Accelerator | None = None, precision: Any = "32-true"
) -> Precision:
    """Return Lightning's precision plugin for ``precision`` on ``backend``'s device.

    ``"32-true"`` is Lightning's plain ``Precision``; ``"bf16-mixed"`` and ``"16-mixed"``
    are its ``MixedPrecision`` with autocast on ``backend.device_type`` (Lightning
    itself would autocast on ``"cuda"`` for any accelerator it does not know), the
    latter with a ``torch.amp.GradScaler`` for that device. For Fabric, see
    :func:`fabric_precision_plugin`.

    Args:
        backend: A backend name, a backend object, or ``None`` for ``accel.get_backend()``.
        precision: ``"32-true"``, ``"bf16-mixed"`` or ``"16-mixed"`` (also ``32``,
            ``"bf16"``, ``16``).

    Raises:
        LightningSetupError: Another precision, or a dtype the backend does not compute in
            (``is_bf16_supported()``/``is_fp16_supported()`` is false).
    """
    mapping = BackendMapping(resolve_backend(backend, "accel.integrations.lightning"), "Trainer")
    mixed = mapping.mixed_precision(precision)
    if mixed is None:
        return Precision()
    return MixedPrecision(mixed, mapping.autocast_device_type)
