"""The precision plugin: autocast on the backend's device type, a scaler for float16."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.plugins.precision import MixedPrecision, Precision

from ..._protocol import Accelerator
from .._backend import resolve_backend
from ._accelerator import lightning_error

__all__ = ["PRECISIONS", "precision_plugin"]

PRECISIONS = ("32-true", "bf16-mixed", "16-mixed")
"""The precisions :func:`precision_plugin` accepts (``32``, ``bf16`` and ``16`` also name them)."""
_ALIASES = {"32": "32-true", 32: "32-true", "bf16": "bf16-mixed", "16": "16-mixed", 16: "16-mixed"}


def precision_plugin(
    backend: str | Accelerator | None = None, precision: Any = "32-true"
) -> Precision:
    """Return Lightning's precision plugin for ``precision`` on ``backend``'s device.

    ``"32-true"`` is Lightning's plain ``Precision``; ``"bf16-mixed"`` and ``"16-mixed"``
    are its ``MixedPrecision`` with autocast on ``backend.device_type`` (Lightning
    itself would autocast on ``"cuda"`` for any accelerator it does not know), the
    latter with a ``torch.amp.GradScaler`` for that device.

    Args:
        backend: A backend name, a backend object, or ``None`` for ``accel.get_backend()``.
        precision: ``"32-true"``, ``"bf16-mixed"`` or ``"16-mixed"`` (also ``32``,
            ``"bf16"``, ``16``).

    Raises:
        LightningSetupError: Another precision, or a dtype the backend does not compute in
            (``is_bf16_supported()``/``is_fp16_supported()`` is false).
    """
    resolved = resolve_backend(backend, "accel.integrations.lightning")
    name = _ALIASES.get(precision, precision)
    if name not in PRECISIONS:
        raise lightning_error(
            f"precision={precision!r} is not supported; choose one of {', '.join(PRECISIONS)}."
        )
    if name == "32-true":
        return Precision()
    supported = (
        resolved.is_bf16_supported() if name == "bf16-mixed" else resolved.is_fp16_supported()
    )
    if not supported:
        dtype = "bfloat16" if name == "bf16-mixed" else "float16"
        raise lightning_error(
            f"precision={precision!r} needs {dtype}, which the {resolved.name} backend does not "
            "compute in. Use precision='32-true' or the other mixed precision."
        )
    return MixedPrecision(name, resolved.device_type)
