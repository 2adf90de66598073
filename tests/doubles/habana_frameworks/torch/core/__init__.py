"""Double of ``habana_frameworks.torch.core``."""

from __future__ import annotations

from habana_frameworks import _double
from habana_frameworks.torch.utils import internal

__all__ = ["mark_step"]


def mark_step(device_str: str = "", sync: bool = False) -> None:
    """Record a flush of the lazy graph; like the bridge, do nothing in eager mode."""
    if not internal.lazy_mode():
        return
    _double.record("core.mark_step", device_str, sync)
