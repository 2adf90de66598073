"""Pieces every backend needs that are the same on every device."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from accel import Availability, DeviceIndexError

__all__ = [
    "autocast_kwargs_for",
    "checked_index",
    "forked_rng",
    "one_host_device",
    "visible_devices",
]


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
    get_device_state: Callable[[int | None], torch.Tensor],
    set_device_state: Callable[[torch.Tensor, int | None], None],
    devices: Sequence[int] | None = None,
) -> Iterator[None]:
    """Save the CPU generator and the generators of ``devices``; restore them all on exit.

    ``devices=None`` means the current device only.
    """
    if not enabled:
        yield
        return
    indices: list[int | None] = [None] if devices is None else list(devices)
    cpu_state = torch.get_rng_state()
    device_states = [(index, get_device_state(index)) for index in indices]
    try:
        yield
    finally:
        torch.set_rng_state(cpu_state)
        for index, state in device_states:
            set_device_state(state, index)


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


def one_host_device() -> Availability:
    """Probe for backends that run on the host: always available, one device."""
    return Availability(available=True, device_count=1)


def visible_devices(
    kind: str, *, compiled: bool, count: Callable[[], int], count_call: str, hint: str
) -> Availability:
    """Probe a torch device module without initialising it.

    Args:
        kind: The device family as users say it (``"CUDA"``).
        compiled: Whether this torch build supports the family at all.
        count: Returns the visible device count without initialising a device.
        count_call: How ``count`` reads in a message (``"torch.cuda.device_count()"``).
        hint: What to check when none is visible.
    """
    if not compiled:
        return Availability.unavailable(
            f"no {kind} device is visible: this torch build ({torch.__version__}) has no "
            f"{kind} support; install a {kind} build of torch."
        )
    found = count()
    if found <= 0:
        return Availability.unavailable(
            f"no {kind} device is visible ({count_call} is {found}); {hint}"
        )
    return Availability(available=True, device_count=found)
