"""Pieces every backend needs that are the same on every device."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from accel import DeviceIndexError

__all__ = ["autocast_kwargs_for", "checked_index", "forked_rng"]


def autocast_kwargs_for(device_type: str, *, cache_supported: bool = True) -> dict[str, Any]:
    """Return the current autocast state of ``device_type`` as ``torch.autocast`` keywords."""
    kwargs: dict[str, Any] = {
        "device_type": device_type,
        "enabled": torch.is_autocast_enabled(device_type),
        "dtype": torch.get_autocast_dtype(device_type),
    }
    if cache_supported:
        kwargs["cache_enabled"] = torch.is_autocast_cache_enabled()
    return kwargs


@contextmanager
def forked_rng(
    enabled: bool,
    get_device_state: Callable[[], torch.Tensor],
    set_device_state: Callable[[torch.Tensor], None],
) -> Iterator[None]:
    """Save the CPU and device generator states, and restore both on exit."""
    if not enabled:
        yield
        return
    cpu_state = torch.get_rng_state()
    device_state = get_device_state()
    try:
        yield
    finally:
        torch.set_rng_state(cpu_state)
        set_device_state(device_state)


def checked_index(backend_name: str, index: int, device_count: int) -> int:
    """Return ``index`` if this process can use it, else raise :class:`DeviceIndexError`."""
    if isinstance(index, bool) or not isinstance(index, int):
        raise DeviceIndexError(
            f"{backend_name}: a device index must be an int, got {index!r} "
            f"({type(index).__name__})."
        )
    if not 0 <= index < device_count:
        visible = f"0..{device_count - 1}" if device_count else "none"
        raise DeviceIndexError(
            f"{backend_name}: device index {index} is out of range; this process sees "
            f"{device_count} device(s) (valid indices: {visible}). Pass a smaller index, or "
            "check the visible-devices environment variable."
        )
    return index
