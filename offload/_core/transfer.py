"""Copies between host memory and the device, on a copy stream, ordered with events.

Every wrapper owns one :class:`Transfers`: a copy stream made with ``backend.Stream()``
(a null stream where the backend has none, so the same code runs everywhere) and the
few protocol calls that order work around it:

* a copy into device memory allocates its destination *on the copy stream*, so the
  allocator never hands it memory that compute work may still read, and tells the
  allocator with ``backend.record_stream`` that the compute stream uses it too;
* compute waits for a copy with ``current_stream().wait_event(event)``; the copy
  stream waits for compute with ``wait_event`` on an event recorded after the
  compute that produced (or last read) the data;
* a device tensor read by the copy stream is marked with ``record_stream`` before it
  is released, so its memory is not reused while the copy still reads it;
* the host reads a copied value only after :meth:`Transfers.wait_host` (an
  ``event.synchronize()`` on the last copy).

:class:`HostPool` keeps page-locked host buffers for activations so that each is
allocated once, not once per step. Page-locked memory is allocated as such
(``backend.empty_pinned``), never pinned from a pageable copy.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

import accel
from accel import Accelerator, AccelError

from .._errors import OffloadConfigError

__all__ = [
    "HostPool",
    "Transfers",
    "copies_needed",
    "dense_stride",
    "expanded_zeros",
    "placeholder",
    "resolve_backend",
    "resolve_device",
]


def copies_needed(device: torch.device, offload_device: torch.device) -> bool:
    """Return whether tensors must be copied between ``offload_device`` and ``device``.

    When both are the same device (training on the host with host offload), tensors
    stay where they are and every transfer is skipped.
    """
    return (device.type, device.index or 0) != (offload_device.type, offload_device.index or 0)


def resolve_backend(backend: Any) -> Accelerator:
    """Return the backend ``backend`` names, by :func:`accel.resolve_backend`'s rule.

    ``None`` is :func:`accel.get_backend`; errors are prefixed with ``offload:``.

    Raises:
        accel.AccelTypeError: ``backend`` is neither a backend, a name nor ``None``.
        accel.BackendNotFoundError, accel.BackendUnavailableError: No backend has that
            name, or it cannot run here.
    """
    return accel.resolve_backend(backend, "offload")


def resolve_device(device: Any, backend: Accelerator) -> torch.device:
    """Return the device to compute on: ``device``, or ``backend.device()`` for ``None``.

    Raises:
        offload.OffloadConfigError: The backend is unavailable, or ``device`` is not one of
            its devices.
    """
    if not backend.is_available():
        raise OffloadConfigError(
            f"offload: backend {backend.name!r} is not available on this machine, so it has "
            "no device to compute on; run `python -m accel` to see the available backends "
            "and pass one with backend=."
        )
    if device is None:
        return backend.device()
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise OffloadConfigError(f"offload: device={device!r} is not a device ({exc}).") from exc
    if resolved.type != backend.device_type:
        raise OffloadConfigError(
            f"offload: device {str(resolved)!r} is not available to backend {backend.name!r}, "
            f"which computes on {backend.device_type!r} devices; pass device=None (the "
            f"backend's current device, {backend.device()}) or choose the backend with "
            "backend=accel.get_backend(name)."
        )
    try:
        return backend.device(resolved.index)
    except AccelError as exc:
        raise OffloadConfigError(
            f"offload: device {str(resolved)!r} is not available: {exc}"
        ) from exc


def dense_stride(tensor: torch.Tensor) -> tuple[int, ...]:
    """Return ``tensor``'s strides if its elements fill a dense block, else contiguous ones.

    Copies keep a dense layout (channels-last weights stay channels-last), so kernels see
    the strides they would see without offload.
    """
    sizes, strides = tensor.shape, tensor.stride()
    order = sorted(range(tensor.dim()), key=lambda dim: (strides[dim], sizes[dim]))
    expected = 1
    for dim in order:
        if sizes[dim] != 1 and strides[dim] != expected:
            return _contiguous_stride(sizes)
        expected *= sizes[dim]
    return tuple(strides)


def _contiguous_stride(sizes: torch.Size) -> tuple[int, ...]:
    stride: list[int] = []
    running = 1
    for size in reversed(sizes):
        stride.append(running)
        running *= max(size, 1)
    return tuple(reversed(stride))


_placeholders: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}
_placeholder_lock = threading.Lock()


def placeholder(like: torch.Tensor) -> torch.Tensor:
    """Return a tensor with ``like``'s shape, dtype and device that holds no memory.

    It is one zero element expanded to the shape. Swapped in as a tensor's ``.data`` it
    releases the tensor's memory while keeping the metadata autograd checks; reading
    it gives zeros, never freed memory.
    """
    return expanded_zeros(like.shape, like.dtype, like.device)


def expanded_zeros(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Return zeros of ``shape``: one cached zero element per dtype and device, expanded."""
    key = (dtype, device)
    with _placeholder_lock:
        scalar = _placeholders.get(key)
        if scalar is None:
            scalar = torch.zeros((), dtype=dtype, device=device)
            _placeholders[key] = scalar
    return scalar.expand(tuple(shape))


class Transfers:
    """The copy streams and the protocol calls that order work around them.

    Loads (host to device) go on :attr:`stream`. Stores (device to host: gradients,
    running statistics, activations) go on :attr:`store_stream`, a second stream where
    the device copies both ways at once (:func:`accel.copy_engines` of 2 or more), else
    the same stream, so a backend with one copy engine keeps one copy stream and one
    without streams copies in order. Every method that queues or orders copies takes
    ``store`` to say which direction it is about.

    Args:
        backend: The backend whose streams, events and pinned memory to use.
    """

    def __init__(self, backend: Accelerator) -> None:
        self.backend = backend
        self.non_blocking = bool(backend.supports_pinned_memory)
        #: Whether stores have a stream of their own (decided once, from the backend).
        self.two_streams = accel.copy_engines(backend) >= 2
        self._stream: Any = None
        self._store_stream: Any = None
        self._last: dict[bool, Any] = {}

    @property
    def stream(self) -> Any:
        """The load stream, made on first use (making one may initialise the device)."""
        if self._stream is None:
            self._stream = self.backend.Stream()
        return self._stream

    @property
    def store_stream(self) -> Any:
        """The store stream: a second stream with two copy engines, else :attr:`stream`."""
        if not self.two_streams:
            return self.stream
        if self._store_stream is None:
            self._store_stream = self.backend.Stream()
        return self._store_stream

    def _of(self, store: bool) -> Any:
        return self.store_stream if store else self.stream

    @contextmanager
    def on_copy_stream(self, *, store: bool = False) -> Iterator[Any]:
        """Queue the work (and allocations) of the block on the load or the store stream.

        Yields:
            The compute stream, i.e. the stream that was current before the block.
        """
        compute = self.backend.current_stream()
        with self.backend.stream(self._of(store)):
            yield compute

    def copy_waits(self, event: Any, *, store: bool = False) -> None:
        """Make the load (or store) stream wait for ``event`` (no-op for ``None``)."""
        if event is not None:
            self._of(store).wait_event(event)

    def copy_waits_for_compute(self, *, store: bool = False) -> None:
        """Make the load (or store) stream wait for everything queued on compute so far."""
        self._of(store).wait_stream(self.backend.current_stream())

    def copy_event(self, *, store: bool = False) -> Any:
        """Record an event after the work queued so far on the load (or store) stream."""
        event = self._of(store).record_event()
        self._last[store] = event
        return event

    def compute_event(self) -> Any:
        """Record an event after the work queued so far on the compute stream."""
        return self.backend.current_stream().record_event()

    def compute_waits(self, event: Any) -> None:
        """Make the compute stream wait for ``event`` (no-op for ``None``)."""
        if event is not None:
            self.backend.current_stream().wait_event(event)

    def used_by(self, tensor: torch.Tensor, stream: Any) -> None:
        """Keep ``tensor``'s memory from reuse until ``stream``'s queued work is done."""
        self.backend.record_stream(tensor, stream)

    def wait_host(self) -> None:
        """Block the host until the last copies have finished, so it can read the results."""
        events, self._last = list(self._last.values()), {}
        for event in events:
            event.synchronize()

    def empty_host(
        self, shape: Sequence[int], dtype: torch.dtype, stride: Sequence[int] | None = None
    ) -> torch.Tensor:
        """Return a new host tensor, allocated page-locked where the backend supports it.

        With ``stride`` (a dense layout, see :func:`dense_stride`) the tensor has those
        strides; otherwise it is contiguous. Its values are undefined.
        """
        if stride is None:
            return self.backend.empty_pinned(tuple(shape), dtype)
        numel = 1
        for size in shape:
            numel *= size
        return self.backend.empty_pinned((numel,), dtype).as_strided(tuple(shape), tuple(stride))


_POOL_BUFFER = "_offload_pool_buffer"


class HostPool:
    """Page-locked host buffers for activations, reused across steps.

    :meth:`acquire` returns a buffer at least as large as asked (the smallest free one
    that fits, else a new one, allocated page-locked); :meth:`release` gives it back with
    the event after the last copy that reads it. Stores into a buffer (on the store
    stream) wait for that event, since the load that read it may run on the other stream.

    Args:
        transfers: Allocates the page-locked buffers and orders the copies.
    """

    def __init__(self, transfers: Transfers) -> None:
        self._transfers = transfers
        self._free: list[tuple[torch.Tensor, Any]] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._free)

    def acquire(self, like: torch.Tensor) -> torch.Tensor:
        """Return a contiguous host tensor with ``like``'s shape and dtype, from the pool.

        Call it on the store stream: the stream is made to wait until the last copy
        that read the buffer before it was released has finished.
        """
        nbytes = like.numel() * like.element_size()
        with self._lock:
            fitting = [k for k, (free, _) in enumerate(self._free) if free.numel() >= nbytes]
            best = min(fitting, key=lambda k: self._free[k][0].numel()) if fitting else None
            buffer, read = self._free.pop(best) if best is not None else (None, None)
        if buffer is None:
            buffer = self._transfers.empty_host((max(nbytes, 1),), torch.uint8)
        self._transfers.copy_waits(read, store=True)
        view = buffer[:nbytes].view(like.dtype).view(like.shape)
        # The view remembers its buffer; a view never given back is freed with it.
        view.__dict__[_POOL_BUFFER] = buffer
        return view

    def release(self, tensor: torch.Tensor, read: Any = None) -> None:
        """Give back a tensor returned by :meth:`acquire`.

        ``read`` is the event after the last copy that reads it (``None``: none pending).
        """
        buffer = tensor.__dict__.pop(_POOL_BUFFER, None)
        if buffer is not None:
            with self._lock:
                self._free.append((buffer, read))

    def clear(self) -> None:
        """Drop every free buffer."""
        with self._lock:
            self._free.clear()
