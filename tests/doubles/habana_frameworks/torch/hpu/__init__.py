"""Double of ``habana_frameworks.torch.hpu``: device queries, streams, events, memory."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from habana_frameworks import _double

__all__ = [
    "Event",
    "Stream",
    "current_device",
    "current_stream",
    "device_count",
    "is_available",
    "max_memory_allocated",
    "memory_allocated",
    "reset_peak_memory_stats",
    "stream",
    "synchronize",
]


def is_available() -> bool:
    """Return whether the double has any device (the ``DEVICE_COUNT`` knob)."""
    _double.record("hpu.is_available")
    return bool(_double.DEVICE_COUNT > 0)


def device_count() -> int:
    """Return the ``DEVICE_COUNT`` knob."""
    _double.record("hpu.device_count")
    return int(_double.DEVICE_COUNT)


def current_device() -> int:
    """Return 0: the bridge runs one device per process."""
    _double.record("hpu.current_device")
    return 0


def synchronize() -> None:
    """Record a wait for the device (there is nothing to wait for)."""
    _double.record("hpu.synchronize")


class Event:
    """Double of ``habana_frameworks.torch.hpu.Event``; always complete."""

    def __init__(self, enable_timing: bool = False) -> None:
        _double.record("hpu.Event", enable_timing)
        self.enable_timing = enable_timing
        self.recorded_on: Stream | None = None

    def record(self, stream: Stream | None = None) -> None:
        """Record this event on ``stream`` (default: the current stream)."""
        _double.record("hpu.Event.record", stream)
        self.recorded_on = current_stream() if stream is None else stream

    def wait(self, stream: Stream | None = None) -> None:
        """Record that ``stream`` (default: the current stream) waits for this event."""
        _double.record("hpu.Event.wait", stream)

    def query(self) -> bool:
        """Return ``True``: the double's work is always done."""
        _double.record("hpu.Event.query")
        return True

    def synchronize(self) -> None:
        """Record a host wait for this event."""
        _double.record("hpu.Event.synchronize")


class Stream:
    """Double of ``habana_frameworks.torch.hpu.Stream``; always idle."""

    def __init__(self, device: Any = None, priority: int = 0) -> None:
        _double.record("hpu.Stream", device, priority)
        self.device = device
        self.priority = priority

    def wait_stream(self, stream: Stream) -> None:
        """Record that this stream waits for ``stream``."""
        _double.record("hpu.Stream.wait_stream", stream)

    def wait_event(self, event: Event) -> None:
        """Record that this stream waits for ``event``."""
        _double.record("hpu.Stream.wait_event", event)

    def record_event(self, event: Event | None = None) -> Event:
        """Record ``event`` (or a new :class:`Event`) on this stream and return it."""
        _double.record("hpu.Stream.record_event", event)
        if event is None:
            event = Event()
        event.record(self)
        return event

    def query(self) -> bool:
        """Return ``True``: nothing is ever pending."""
        _double.record("hpu.Stream.query")
        return True

    def synchronize(self) -> None:
        """Record a host wait for this stream."""
        _double.record("hpu.Stream.synchronize")


# The default stream is created without recording, as the bridge creates it itself.
_default_stream = Stream.__new__(Stream)
_default_stream.device = None
_default_stream.priority = 0
_stream_stack: list[Stream] = []


def _reset_streams() -> None:
    _stream_stack.clear()


_double.on_reset(_reset_streams)


def current_stream() -> Stream:
    """Return the stream that work is queued on now (the default stream outside ``stream``)."""
    _double.record("hpu.current_stream")
    return _stream_stack[-1] if _stream_stack else _default_stream


@contextmanager
def stream(s: Stream | None) -> Iterator[Stream | None]:
    """Make ``s`` the current stream inside the block (``None`` changes nothing)."""
    _double.record("hpu.stream", s)
    if s is None:
        yield s
        return
    _stream_stack.append(s)
    try:
        yield s
    finally:
        _stream_stack.pop()


def memory_allocated(device: Any = None) -> int:
    """Return the ``MEMORY_ALLOCATED`` knob."""
    _double.record("hpu.memory_allocated", device)
    return int(_double.MEMORY_ALLOCATED)


def max_memory_allocated(device: Any = None) -> int:
    """Return the ``MAX_MEMORY_ALLOCATED`` knob."""
    _double.record("hpu.max_memory_allocated", device)
    return int(_double.MAX_MEMORY_ALLOCATED)


def reset_peak_memory_stats(device: Any = None) -> None:
    """Start a new peak: ``MAX_MEMORY_ALLOCATED`` becomes ``MEMORY_ALLOCATED``."""
    _double.record("hpu.reset_peak_memory_stats", device)
    _double.MAX_MEMORY_ALLOCATED = _double.MEMORY_ALLOCATED
