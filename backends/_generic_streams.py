"""Streams and events for a device whose module has none: torch's generic classes.

``torch.Stream`` and ``torch.Event`` work on every device type that registers a device
guard, and ``torch.accelerator`` (torch 2.6 and later) reads and sets the current stream
of the current accelerator. A PrivateUse1 module need not define ``Stream``, ``Event``,
``current_stream`` or ``stream`` (PyTorch's reference device defines none of them), so
the generic backend builds them from these.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch

from accel import _compat

__all__ = [
    "DeferredRelease",
    "GenericEvent",
    "GenericStream",
    "generic_streams_available",
    "stream_context",
]


def generic_streams_available() -> bool:
    """Whether this torch can read and set the current stream without a device module."""
    return (
        hasattr(torch, "Stream")
        and hasattr(torch, "Event")
        and _compat.accelerator_function("current_stream") is not None
        and _compat.accelerator_function("set_stream") is not None
        and _compat.accelerator_function("set_device_index") is not None
    )


class GenericStream:
    """``backend.Stream()``: a new ``torch.Stream`` on the backend's current device.

    Args:
        current_device: Returns the device new streams go to.
    """

    def __init__(self, current_device: Callable[[], torch.device]) -> None:
        self._current_device = current_device

    def __call__(self, device: Any = None, priority: int = 0) -> Any:
        """Return a new stream on ``device`` (default: the current device)."""
        target = self._current_device() if device is None else torch.device(device)
        stream = torch.Stream(device=target, priority=priority)
        current = _compat.accelerator_function("current_stream")
        if current is not None and stream == current(target):
            # A device's stream pool may hand out the stream already current (PyTorch's
            # reference device returns its default stream first): a side stream it is not.
            stream = torch.Stream(device=target, priority=priority)
        return stream


class GenericEvent:
    """``backend.Event()``: a new ``torch.Event`` for the backend's device type.

    Args:
        device_type: The device type events are recorded on.
    """

    def __init__(self, device_type: str) -> None:
        self._device_type = device_type

    def __call__(
        self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ) -> Any:
        """Return a new event (its device index is taken when it is first recorded)."""
        return torch.Event(
            device=self._device_type,
            enable_timing=enable_timing,
            blocking=blocking,
            interprocess=interprocess,
        )


def stream_context(stream: Any) -> AbstractContextManager[Any]:
    """Return a context that makes ``stream`` current and restores the previous one.

    Built on ``torch.accelerator.set_stream`` rather than ``with torch.Stream(...)``
    (torch 2.7+), which on torch 2.13 does not switch the current device to a stream on
    another device.
    """
    return _stream_context(stream)


@contextmanager
def _stream_context(stream: Any) -> Iterator[Any]:
    current = _compat.accelerator_function("current_stream")
    set_stream = _compat.accelerator_function("set_stream")
    index = _compat.accelerator_function("current_device_index")
    set_index = _compat.accelerator_function("set_device_index")
    assert current and set_stream and index and set_index  # generic_streams_available()
    previous_index = index()
    previous = current(stream.device)
    # set_stream also makes the stream's device current, as torch.cuda.stream does.
    set_stream(stream)
    try:
        yield stream
    finally:
        set_stream(previous)
        set_index(previous_index)


class DeferredRelease:
    """``record_stream`` for a device whose allocator cannot be told about streams.

    Some devices have no ``record_stream`` kernel (``aten::record_stream`` falls back to
    the CPU, which has none). Their memory is then kept from reuse by holding the
    tensor's storage until an event recorded on the using stream has completed; each
    call, and :meth:`release_all`, drops the holds whose events are done.
    """

    def __init__(self) -> None:
        self._held: list[tuple[Any, Any]] = []

    def hold(self, tensor: torch.Tensor, stream: Any) -> None:
        """Keep ``tensor``'s storage alive until the work queued on ``stream`` is done."""
        self._held = [(event, storage) for event, storage in self._held if not event.query()]
        self._held.append((stream.record_event(), tensor.untyped_storage()))

    def release_all(self) -> None:
        """Drop every hold (call once the device has finished all work)."""
        self._held.clear()

    def __len__(self) -> int:
        return len(self._held)
