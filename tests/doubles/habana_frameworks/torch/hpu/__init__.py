"""Double of ``habana_frameworks.torch.hpu``: device queries, streams, events, memory.

As in the bridge: ``is_available()`` and ``device_count()`` count cards without acquiring
one (``device_count()`` counts every card on the node, ``DEVICE_COUNT``); ``init()``,
memory statistics and streams acquire this process's card; ``current_stream()`` returns
a new object per call in eager mode and one cached object in lazy mode.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.utils.checkpoint

from habana_frameworks import _double
from habana_frameworks.torch.utils import internal

from .random import get_rng_state, manual_seed, set_rng_state

__all__ = [
    "HABANA_VISIBLE_MODULES_VAR",
    "HLS_MODULE_ID_VAR",
    "Event",
    "Stream",
    "current_device",
    "current_stream",
    "device_count",
    "get_rng_state",
    "init",
    "is_available",
    "is_initialized",
    "manual_seed",
    "max_memory_allocated",
    "memory_allocated",
    "reset_peak_memory_stats",
    "set_rng_state",
    "stream",
    "synchronize",
]

HABANA_VISIBLE_MODULES_VAR = "HABANA_VISIBLE_MODULES"
HLS_MODULE_ID_VAR = "HLS_MODULE_ID"


def _checked_device(device: Any) -> None:
    """Accept ``None``, an int, or an hpu device; raise ``ValueError`` like the bridge."""
    if device is None or (isinstance(device, int) and not isinstance(device, bool)):
        return
    if isinstance(device, torch.device) and device.type == "hpu":
        return
    if isinstance(device, str):
        try:
            parsed = torch.device(device)
        except RuntimeError:
            parsed = None
        if parsed is not None and parsed.type == "hpu":
            return
    raise ValueError(f"Expected a hpu device, but got: {device!r}")


def init() -> None:
    """Acquire the card; like the bridge, make checkpoint's default device type "hpu"."""
    _double.record("hpu.init")
    _double.acquire_device("hpu.init")
    checkpoint = torch.utils.checkpoint.DefaultDeviceType
    if checkpoint.get_device_type() != "hpu":
        _double.patch(checkpoint, "_default_device_type", "hpu")


def is_initialized() -> bool:
    """Return whether this process has acquired its card."""
    return bool(_double.DEVICE_ACQUIRED)


def is_available() -> bool:
    """Return whether the double has any device (the ``DEVICE_COUNT`` knob)."""
    _double.record("hpu.is_available")
    return bool(_double.DEVICE_COUNT > 0)


def device_count() -> int:
    """Return the ``DEVICE_COUNT`` knob."""
    _double.record("hpu.device_count")
    return int(_double.DEVICE_COUNT)


def current_device() -> int:
    """Return 0: the bridge runs one device per process (acquires the card, like it)."""
    _double.record("hpu.current_device")
    _double.acquire_device("hpu.current_device")
    return 0


def synchronize() -> None:
    """Record a wait for the device (there is nothing to wait for)."""
    _double.record("hpu.synchronize")


class Event:
    """Double of ``habana_frameworks.torch.hpu.Event``; always complete."""

    def __init__(self, enable_timing: bool = False) -> None:
        _double.record("hpu.Event", enable_timing)
        _double.acquire_device("hpu.Event")
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

    _ids = itertools.count(1)

    def __init__(self, device: Any = None, priority: int = 0) -> None:
        _double.record("hpu.Stream", device, priority)
        _checked_device(device)
        _double.acquire_device("hpu.Stream")
        self.device = device
        self.priority = priority
        self.stream_id = next(Stream._ids)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other.stream_id == self.stream_id

    def __hash__(self) -> int:
        return hash(("hpu-stream", self.stream_id))

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


_DEFAULT_STREAM_ID = 0
_stream_stack: list[Stream] = []
_lazy_current: dict[int, Stream] = {}


def _reset_streams() -> None:
    _stream_stack.clear()
    _lazy_current.clear()


_double.on_reset(_reset_streams)


def _wrapper(stream_id: int) -> Stream:
    """A new Python object for an existing stream (the bridge wraps its handle anew)."""
    wrapper = Stream.__new__(Stream)
    wrapper.device = None
    wrapper.priority = 0
    wrapper.stream_id = stream_id
    return wrapper


def current_stream(device: Any = None) -> Stream:
    """Return the stream that work is queued on now (the default stream outside ``stream``).

    Eager mode: a new object per call, equal (``==``) but not identical to the last one.
    Lazy mode: the same object for the same stream. Acquires the card.
    """
    _double.record("hpu.current_stream")
    _checked_device(device)
    _double.acquire_device("hpu.current_stream")
    stream_id = _stream_stack[-1].stream_id if _stream_stack else _DEFAULT_STREAM_ID
    if internal.lazy_mode():
        return _lazy_current.setdefault(stream_id, _wrapper(stream_id))
    return _wrapper(stream_id)


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
    _checked_device(device)
    _double.acquire_device("hpu.memory_allocated")
    return int(_double.MEMORY_ALLOCATED)


def max_memory_allocated(device: Any = None) -> int:
    """Return the ``MAX_MEMORY_ALLOCATED`` knob."""
    _double.record("hpu.max_memory_allocated", device)
    _checked_device(device)
    _double.acquire_device("hpu.max_memory_allocated")
    return int(_double.MAX_MEMORY_ALLOCATED)


def reset_peak_memory_stats(device: Any = None) -> None:
    """Start a new peak: ``MAX_MEMORY_ALLOCATED`` becomes ``MEMORY_ALLOCATED``."""
    _double.record("hpu.reset_peak_memory_stats", device)
    _checked_device(device)
    _double.acquire_device("hpu.reset_peak_memory_stats")
    _double.MAX_MEMORY_ALLOCATED = _double.MEMORY_ALLOCATED
