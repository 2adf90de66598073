"""A CPU backend whose streams keep vector clocks, and a race detector over its work.

CPU work is synchronous, so no test on the host can see two copies overlap. This
backend says it has streams (and ``copy_engines`` copy engines) and tracks, for every
tensor operation, the stream it was queued on and that stream's vector clock; events and
``wait_event``/``wait_stream`` carry clocks as a device's would. :meth:`Timeline.races`
then lists every pair of operations on different streams that touch the same memory,
one of them writing, without the earlier one ordered before the later one by events
(or by a host synchronisation on an event recorded after it). Any such pair is a race
on a real device, whatever the CPU happened to do.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from backends.cpu import CpuBackend

__all__ = ["Access", "StreamedCpu", "Timeline"]

_ALLOCATIONS = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided"}


class ClockStream:
    """A stream whose clock counts its operations and what it waited for."""

    _ids = itertools.count(1)

    def __init__(self, timeline: Timeline | None = None) -> None:
        self.id = next(self._ids)
        self.timeline = timeline
        self.clock: dict[int, int] = {self.id: 0}

    def merge(self, clock: dict[int, int]) -> None:
        for stream, tick in clock.items():
            self.clock[stream] = max(self.clock.get(stream, 0), tick)

    def wait_event(self, event: Any) -> None:
        assert isinstance(event, ClockEvent), event
        if self.timeline is not None:
            self.timeline.log.append(("wait_event", self.id, event.id))
        self.merge(event.clock)

    def wait_stream(self, stream: Any) -> None:
        assert isinstance(stream, ClockStream), stream
        self.merge(stream.clock)

    def record_event(self, event: Any = None) -> ClockEvent:
        event = event if event is not None else ClockEvent(self.timeline)
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        if self.timeline is not None:
            self.timeline.host_waits(self.clock)

    def __repr__(self) -> str:
        return f"ClockStream({self.id})"


class ClockEvent:
    """An event: the clock of the stream it was recorded on, at that point."""

    _ids = itertools.count(1)

    def __init__(self, timeline: Timeline | None = None, **_: Any) -> None:
        self.id = next(self._ids)
        self.timeline = timeline
        self.clock: dict[int, int] = {}

    def record(self, stream: Any = None) -> None:
        assert self.timeline is not None
        stream = stream if stream is not None else self.timeline.current
        self.clock = dict(stream.clock)
        self.timeline.log.append(("record", stream.id, self.id))

    def wait(self, stream: Any = None) -> None:
        assert self.timeline is not None
        (stream if stream is not None else self.timeline.current).wait_event(self)

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        assert self.timeline is not None
        self.timeline.host_waits(self.clock)


@dataclass
class Access:
    """One operation's use of one block of memory."""

    position: int
    op: str
    stream: int
    tick: int
    clock: dict[int, int]
    write: bool
    span: tuple[int, int]  # bytes [start, stop) of the storage


class Timeline(TorchDispatchMode):
    """Records every tensor operation with its stream and clock (a dispatch mode)."""

    def __init__(self) -> None:
        super().__init__()
        self.compute = ClockStream(self)
        self.current = self.compute
        self.host: dict[int, int] = {}
        self.accesses: dict[tuple[int, int], list[Access]] = {}
        self.log: list[tuple[str, int, int]] = []
        self.ops: list[tuple[str, int]] = []
        self.allocations: list[tuple[int, int]] = []  # (stream id, elements)
        # Per address, a weak reference to the storage there and its generation: memory
        # freed and allocated again is another block (weak, so that nothing is kept alive
        # and offload's own reuse, of memory it still holds, stays one block).
        self._blocks: dict[int, tuple[StorageWeakRef, int]] = {}

    def host_waits(self, clock: dict[int, int]) -> None:
        for stream, tick in clock.items():
            self.host[stream] = max(self.host.get(stream, 0), tick)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.__name__.split(".")[0]
        stream = self.current
        # Work queued after the host waited for an event comes after that event's work.
        stream.merge(self.host)
        stream.clock[stream.id] += 1
        tick, clock = stream.clock[stream.id], dict(stream.clock)
        position = len(self.ops)
        self.ops.append((name, stream.id))
        schema = func._schema
        if schema.returns and all(
            r.alias_info is not None and not r.alias_info.is_write for r in schema.returns
        ):
            return out  # a view: no memory is read or written
        if name in _ALLOCATIONS:  # new memory, no values
            self.allocations.append((stream.id, out.numel()))
            return out
        named = dict(zip((a.name for a in schema.arguments), args, strict=False)) | kwargs
        written = [
            named[a.name]
            for a in schema.arguments
            if a.alias_info is not None
            and a.alias_info.is_write
            and isinstance(named.get(a.name), torch.Tensor)
        ]
        if not any(r.alias_info is not None for r in schema.returns):  # fresh outputs
            written += [v for v in tree_flatten(out)[0] if isinstance(v, torch.Tensor)]
        writes = {id(t) for t in written}
        read = [
            value
            for value in tree_flatten((args, kwargs))[0]
            if isinstance(value, torch.Tensor) and id(value) not in writes
        ]
        for tensor, write in [*((t, True) for t in written), *((t, False) for t in read)]:
            key, span = self._where(tensor)
            if key[0]:  # 0: no memory (an empty tensor)
                self.accesses.setdefault(key, []).append(
                    Access(position, name, stream.id, tick, clock, write, span)
                )
        return out

    def _where(self, tensor: torch.Tensor) -> tuple[tuple[int, int], tuple[int, int]]:
        """The block ``tensor`` lives in ((0, 0): none) and the bytes of it that it spans."""
        storage = tensor.untyped_storage()
        if not storage.nbytes() or not tensor.numel():
            return (0, 0), (0, 0)
        address = int(storage.data_ptr())
        known = self._blocks.get(address)
        generation = 0 if known is None else known[1] + int(known[0].expired())
        if known is None or known[0].expired():
            self._blocks[address] = (StorageWeakRef(storage), generation)
        size = tensor.element_size()
        start = tensor.storage_offset() * size
        steps = zip(tensor.shape, tensor.stride(), strict=True)
        extent = 1 + sum((n - 1) * abs(step) for n, step in steps)
        return (address, generation), (start, start + extent * size)

    def races(self) -> list[tuple[Access, Access]]:
        """Pairs (earlier, later) on different streams, one writing, not ordered."""
        found = []
        for accesses in self.accesses.values():
            for later_index, later in enumerate(accesses):
                for earlier in accesses[:later_index]:
                    if earlier.stream == later.stream or not (earlier.write or later.write):
                        continue
                    if earlier.span[1] <= later.span[0] or later.span[1] <= earlier.span[0]:
                        continue  # different bytes of one block
                    if later.clock.get(earlier.stream, 0) < earlier.tick:
                        found.append((earlier, later))
        return found

    def copies_on(self, stream: Any) -> int:
        """How many ``copy_`` operations were queued on ``stream``."""
        return sum(1 for name, sid in self.ops if name == "copy_" and sid == stream.id)


class StreamedCpu(CpuBackend):
    """The ``cpu`` backend, with clock streams and ``copy_engines`` copy engines."""

    name = "streamed"
    supports_streams = True  # type: ignore[assignment]

    def __init__(self, timeline: Timeline, copy_engines: int = 2) -> None:
        self.timeline = timeline
        self.copy_engines = copy_engines
        self.streams: list[ClockStream] = []

    def Stream(self, *args: Any, **kwargs: Any) -> ClockStream:  # type: ignore[override]
        stream = ClockStream(self.timeline)
        self.streams.append(stream)
        return stream

    def Event(self, *args: Any, **kwargs: Any) -> ClockEvent:  # type: ignore[override]
        return ClockEvent(self.timeline)

    def current_stream(self) -> ClockStream:  # type: ignore[override]
        return self.timeline.current

    @contextmanager
    def _on(self, stream: ClockStream) -> Iterator[ClockStream]:
        previous, self.timeline.current = self.timeline.current, stream
        try:
            yield stream
        finally:
            self.timeline.current = previous

    def stream(self, stream: Any) -> Any:  # type: ignore[override]
        return self._on(stream)
