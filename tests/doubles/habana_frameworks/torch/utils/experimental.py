"""Double of ``habana_frameworks.torch.utils.experimental``."""

from __future__ import annotations

from habana_frameworks import _double

__all__ = ["_is_fp16_supported"]


def _is_fp16_supported() -> bool:
    """Return the ``FP16_SUPPORTED`` knob (Gaudi2 and later compute in float16)."""
    _double.record("utils.experimental._is_fp16_supported")
    return bool(_double.FP16_SUPPORTED)
