"""Streams and events for devices without concurrent streams.

Work on such a device is done by the time the call that queued it returns, so every
ordering request is already satisfied: these objects record nothing and never wait.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

__all__ = [
    "NullEvent",
    "NullStream",
    "WithoutDeviceMemory",
    "WithoutStreams",
    "null_stream_context",
]


class NullEvent:
    """An event that is always complete."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False) -> None:
        self.enable_timing = enable_timing
        self.blocking = blocking

    def record(self, stream: Any = None) -> None:
        """Do nothing: all earlier work has already finished."""

    def wait(self, stream: Any = None) -> None:
        """Do nothing: the event is complete."""

    def query(self) -> bool:
        """Return ``True``: the event is complete."""
        return True

    def synchronize(self) -> None:
        """Return at once: the event is complete."""

    def __repr__(self) -> str:
        return "NullEvent()"


class NullStream:
    """A stream whose queued work is finished as soon as it is issued."""

    def __init__(self, device: Any = None, priority: int = 0) -> None:
        self.device = device
        self.priority = priority

    def wait_stream(self, stream: Any) -> None:
        """Do nothing: ``stream`` has no pending work."""

    def wait_event(self, event: Any) -> None:
        """Do nothing: every event is complete."""

    def record_event(self, event: Any = None) -> Any:
        """Return ``event``, or a new :class:`NullEvent` when none is given."""
        return NullEvent() if event is None else event

    def query(self) -> bool:
        """Return ``True``: nothing is pending."""
        return True

    def synchronize(self) -> None:
        """Return at once: nothing is pending."""

    def __repr__(self) -> str:
        return "NullStream()"


def null_stream_context(stream: Any) -> AbstractContextManager[Any]:
    """Return a context that does nothing, for backends whose streams are null."""
    return nullcontext(stream)


class WithoutStreams:
    """Stream members for a backend whose work is ordered without user-visible streams."""

    supports_streams = False
    copy_engines = 0
    Stream = NullStream
    Event = NullEvent
    _null_stream = NullStream()

    def current_stream(self) -> NullStream:
        """Return the null stream: there is one implicit stream."""
        return self._null_stream

    def stream(self, stream: Any) -> AbstractContextManager[Any]:
        """Return a context that does nothing."""
        return null_stream_context(stream)

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None:
        """Do nothing: with one implicit stream, no other stream can still use ``tensor``."""


class WithoutDeviceMemory:
    """Memory members for a backend that computes in host (or unified) memory.

    Nothing needs pinning, so :meth:`pin_memory` returns its input; torch keeps no
    allocation statistics for such memory, so the figures read 0.
    """

    supports_pinned_memory = False
    supports_memory_stats = False

    def memory_allocated(self) -> int:
        """Return 0: see :attr:`supports_memory_stats`."""
        return 0

    def max_memory_allocated(self) -> int:
        """Return 0: see :attr:`supports_memory_stats`."""
        return 0

    def reset_peak_memory_stats(self) -> None:
        """Do nothing: there is no peak to reset."""

    def pin_memory(self, tensor: torch.Tensor) -> torch.Tensor:
        """Return ``tensor`` unchanged: see :attr:`supports_pinned_memory`."""
        return tensor

    def empty_pinned(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """Return ``torch.empty(shape, dtype=dtype)``: host memory needs no pinning."""
        return torch.empty(tuple(shape), dtype=dtype)
