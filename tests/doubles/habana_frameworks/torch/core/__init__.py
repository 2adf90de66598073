"""Double of ``habana_frameworks.torch.core``."""

from __future__ import annotations

from habana_frameworks import _double

__all__ = ["mark_step"]


def mark_step(device_str: str = "", sync: bool = False) -> None:
    """Record a flush of the lazy graph (the real one sends it to the device)."""
    _double.record("core.mark_step", device_str, sync)
