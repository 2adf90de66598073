"""The :class:`Accelerator` protocol: everything the algorithms may ask of a device.

``checkpointing`` and ``offload`` talk to hardware only through these members. A need
they have that is not here is a change to this file, never a branch on a backend name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

__all__ = [
    "Accelerator",
    "Event",
    "Stream",
    "declared_members",
    "iter_missing_members",
    "protocol_members",
]


@runtime_checkable
class Event(Protocol):
    """A marker in a stream's work queue, used to order work across streams.

    ``torch.cuda.Event`` satisfies this protocol. Backends without streams return an
    event whose methods complete at once (``query()`` is always ``True``).
    """

    def record(self, stream: Any = None) -> None:
        """Mark the point reached so far by ``stream`` (default: the current stream)."""

    def wait(self, stream: Any = None) -> None:
        """Make ``stream`` (default: the current stream) wait until this event completes."""

    def query(self) -> bool:
        """Return whether the work before this event has finished, without blocking."""

    def synchronize(self) -> None:
        """Block the host until the work before this event has finished."""


@runtime_checkable
class Stream(Protocol):
    """An ordered queue of device work.

    ``torch.cuda.Stream`` satisfies this protocol. Backends without streams return a
    stream whose methods complete at once, so the same code runs everywhere.
    """

    def wait_stream(self, stream: Any) -> None:
        """Make work queued on this stream from now on wait for everything on ``stream``."""

    def wait_event(self, event: Any) -> None:
        """Make work queued on this stream from now on wait for ``event``."""

    def record_event(self, event: Any = None) -> Any:
        """Record ``event`` (or a new one) at this point of the stream and return it."""

    def query(self) -> bool:
        """Return whether all work queued on this stream has finished, without blocking."""

    def synchronize(self) -> None:
        """Block the host until all work queued on this stream has finished."""


_Stream = Stream
_Event = Event


@runtime_checkable
class Accelerator(Protocol):
    """What a backend provides: one kind of device, as seen from one process.

    ``isinstance(obj, Accelerator)`` only checks that the names exist; the conformance
    suite (``python -m pytest --pyargs accel.conformance``) checks the behaviour.

    Rules that hold for every member:

    * Nothing here may initialise the device except the members documented to touch
      it (``device_count`` and ``is_available`` in particular never do), so a process
      that only asked questions can still ``fork``.
    * No member changes process-wide settings (deterministic algorithms, environment
      variables, default dtypes) as a side effect.
    * ``index`` arguments are plain device indices local to this process; ``None`` means
      the current device.

    Optional members (:func:`optional_members`) may be left out: accel supplies a
    default for a backend that does not define them, so adding one never makes an
    existing plugin incomplete. Today there are three: ``recompute_barrier``
    (:class:`RecomputeBarrier`; default :func:`accel.recompute_barrier`),
    ``copy_engines`` (:class:`CopyEngines`; default :func:`accel.copy_engines`) and
    ``attention_kernel`` (:class:`AttentionKernel`; default
    :func:`accel.attention_kernel`).
    """

    # Identity -----------------------------------------------------------------------

    @property
    def name(self) -> str:
        """Backend name as selected by ``ACCEL`` (lowercase, e.g. ``"cuda"``)."""

    @property
    def device_type(self) -> str:
        """The ``torch.device`` type this backend computes on (e.g. ``"cuda"``, ``"hpu"``)."""

    def device(self, index: int | None = None) -> torch.device:
        """Return the ``torch.device`` for ``index`` (default: the current device).

        Must not initialise the device. Raises :class:`accel.DeviceIndexError` for an
        index this process cannot use.
        """

    def device_count(self) -> int:
        """Return how many devices this process can use, without initialising any.

        Every index below it is usable by :meth:`device` in this process, and no other:
        a device library that sees more devices than the process may use reports what
        the process may use (Gaudi: 1 per process).
        """

    def current_device(self) -> int:
        """Return the index of the device that new tensors and work go to."""

    def set_device(self, index: int) -> None:
        """Make ``index`` the current device; :class:`accel.DeviceIndexError` if invalid."""

    def is_available(self) -> bool:
        """Return whether this backend can run here. Never raises, never initialises."""

    # Ordering -------------------------------------------------------------------------

    def synchronize(self) -> None:
        """Block the host until all queued work on the current device has finished."""

    def mark_step(self) -> None:
        """Flush the lazily accumulated graph to the device.

        A no-op on eager backends. Cheap to call, and safe at any time, including
        inside ``no_grad`` and during backward. It never waits for the device.
        """

    @property
    def is_lazy(self) -> bool:
        """Whether ops are accumulated into a graph that ``mark_step`` must flush."""

    # Capabilities: algorithms branch on these, never on ``name``. ---------------------

    @property
    def is_asynchronous(self) -> bool:
        """Whether device work runs asynchronously to the host (results need ordering)."""

    @property
    def supports_streams(self) -> bool:
        """Whether extra streams really run concurrently (copy/compute overlap is possible)."""

    @property
    def supports_pinned_memory(self) -> bool:
        """Whether :meth:`pin_memory` returns page-locked memory that speeds transfers."""

    @property
    def supports_memory_stats(self) -> bool:
        """Whether :meth:`memory_allocated` and friends report real figures (else 0)."""

    # RNG ------------------------------------------------------------------------------

    def manual_seed(self, seed: int) -> None:
        """Seed the generator of the current device (the CPU generator on ``cpu``)."""

    def get_rng_state(self, index: int | None = None) -> torch.Tensor:
        """Return a copy of device ``index``'s generator state as a ``uint8`` tensor.

        ``None`` means the current device. An index this process cannot use raises
        :class:`accel.DeviceIndexError`. Reading a state never initialises a device
        that the call does not name.
        """

    def set_rng_state(self, state: torch.Tensor, index: int | None = None) -> None:
        """Restore a state returned by :meth:`get_rng_state` on device ``index``.

        ``None`` means the current device; only that device's generator changes.
        """

    def fork_rng(
        self, enabled: bool = True, devices: Sequence[int] | None = None
    ) -> AbstractContextManager[None]:
        """Return a context that restores the CPU generator and device generators on exit.

        ``devices`` lists the device indices whose generators are saved and restored;
        ``None`` means the current device only. The states are restored whether the
        block finishes or raises. With ``enabled=False`` the context does nothing.
        """

    # Autocast -------------------------------------------------------------------------

    def autocast_kwargs(self) -> dict[str, Any]:
        """Return this device's current autocast state as ``torch.autocast`` keywords.

        ``torch.autocast(**backend.autocast_kwargs())`` re-enters the state that was
        active when this was called, so an algorithm can capture it in forward and
        replay it in backward. Keys: ``device_type``, ``enabled``, ``dtype``, and
        ``cache_enabled`` where the device supports autocast caching.
        """

    # Streams --------------------------------------------------------------------------

    @property
    def Stream(self) -> Callable[..., _Stream]:
        """The stream class; ``backend.Stream()`` makes a new stream on the current device."""

    @property
    def Event(self) -> Callable[..., _Event]:
        """The event class; ``backend.Event()`` makes a new event."""

    def current_stream(self) -> _Stream:
        """Return the stream that work is queued on now. Never ``None``."""

    def stream(self, stream: _Stream) -> AbstractContextManager[Any]:
        """Return a context in which work is queued on ``stream``."""

    def record_stream(self, tensor: torch.Tensor, stream: _Stream) -> None:
        """Tell the allocator that ``tensor`` is used by work queued on ``stream``.

        Its memory is then not reused until that work is done, even if the tensor is
        freed on another stream first. A no-op where streams do not run concurrently.
        """

    # Memory ---------------------------------------------------------------------------

    def memory_allocated(self) -> int:
        """Bytes held by tensors on the current device (0 without memory stats)."""

    def max_memory_allocated(self) -> int:
        """Peak of :meth:`memory_allocated` since the last reset (0 without stats)."""

    def reset_peak_memory_stats(self) -> None:
        """Start a new peak for :meth:`max_memory_allocated`."""

    def empty_cache(self) -> None:
        """Return cached, unused device memory to the system where the backend can."""

    def pin_memory(self, tensor: torch.Tensor) -> torch.Tensor:
        """Return ``tensor`` in memory the device can copy from asynchronously.

        Returns ``tensor`` itself where :attr:`supports_pinned_memory` is false.
        """

    def empty_pinned(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """Return a new, uninitialised host tensor the device can copy from asynchronously.

        Allocated page-locked from the start (``pin_memory(torch.empty(...))`` would
        allocate pageable memory and copy it); a plain ``torch.empty`` on the host where
        :attr:`supports_pinned_memory` is false. Contiguous, on ``cpu``, never
        initialises values (write before reading).
        """

    # Compilation ----------------------------------------------------------------------

    @property
    def compile_backend(self) -> str:
        """The ``torch.compile`` backend for this device.

        ``torch.compile(model, backend=backend.compile_backend)`` compiles for this
        device on every backend: ``"inductor"`` on ``cpu``, ``cuda`` and ``xpu``,
        ``"hpu_backend"`` on Gaudi. Reading it imports and initialises nothing.
        """

    # Dtypes and distributed -----------------------------------------------------------

    def is_bf16_supported(self) -> bool:
        """Whether the device computes in ``torch.bfloat16``."""

    def is_fp16_supported(self) -> bool:
        """Whether the device computes in ``torch.float16``."""

    @property
    def communication_backend(self) -> str:
        """The ``torch.distributed`` backend for this device: ``nccl``, ``hccl``, ``gloo``...

        ``"undefined"`` (torch's ``Backend.UNDEFINED``) on a device for which torch has
        none; :meth:`prepare_distributed` then raises, saying so.
        """

    def prepare_distributed(self) -> None:
        """Do what must happen before ``torch.distributed.init_process_group``.

        Idempotent; a no-op where nothing is needed. Raises
        :class:`accel.DistributedSetupError` where the device has no communication
        backend.
        """


def protocol_members() -> tuple[str, ...]:
    """Return the names every :class:`Accelerator` must provide, sorted."""
    return _PROTOCOL_MEMBERS


def declared_members(protocol: type) -> tuple[str, ...]:
    """Return the public names ``protocol`` declares, sorted."""
    return tuple(sorted(name for name in vars(protocol) if not name.startswith("_")))


_PROTOCOL_MEMBERS = declared_members(Accelerator)


def iter_missing_members(obj: object) -> Iterator[str]:
    """Yield the protocol members ``obj`` lacks, in sorted order."""
    for member in _PROTOCOL_MEMBERS:
        if not hasattr(obj, member):
            yield member
