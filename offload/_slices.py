"""Which slices are in device memory: double-buffered loading, and tied tensors.

:class:`Residency` owns two device buffers per dtype ("ping-pong"), each as large as
the largest slice that uses it: slice ``i`` always loads into buffer ``i % 2``. At most
two slices are therefore in device memory at any time, loading slice ``i + 1`` overlaps
with computing slice ``i``, and tensors that autograd saved from slice ``i``'s
parameters are valid again whenever slice ``i`` is loaded for its backward. A buffer is
refilled only after the compute stream is done with its previous slice (an event), and
compute uses a slice only after its copy finished (another event).

Tensors used by several slices (tied weights) are packed once, in a shared storage with
a device buffer of its own: it is loaded and attached together with every slice that
uses it, and its gradient accumulates over those slices' backward passes on the device,
exactly as autograd sums a tied weight's uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ._storage import SliceStorage
from ._transfer import Transfers, dense_stride

__all__ = ["Residency"]


@dataclass
class _Buffer:
    """One of the two device buffers: per dtype a flat device tensor, and who is in it."""

    tensors: dict[torch.dtype, torch.Tensor] = field(default_factory=dict)
    holder: int | None = None
    attached: bool = False
    loaded: Any = None
    done: Any = None
    views: dict[int, list[torch.Tensor]] = field(default_factory=dict)


@dataclass
class _Gradients:
    """A slice's gradients while it is attached: device copies and the host ones set aside."""

    device: dict[int, torch.Tensor] = field(default_factory=dict)
    stashed: dict[int, torch.Tensor | None] = field(default_factory=dict)


class Residency:
    """Which slices are in device memory, and the copies that put them there.

    Args:
        slices: The model's slices.
        transfers: The wrapper's copy stream.
        device: The compute device.
        copy: Whether to copy at all (``False``: device and offload device are the same,
            and only the bookkeeping runs).
        shared: Storages of tensors used by several slices, each with the indices of
            the slices that use it.
    """

    def __init__(
        self,
        slices: Sequence[SliceStorage],
        transfers: Transfers,
        device: torch.device,
        *,
        copy: bool,
        shared: Sequence[tuple[SliceStorage, Sequence[int]]] = (),
    ) -> None:
        self.slices = list(slices)
        self.transfers = transfers
        self.device = device
        self.copy = copy
        self._ping = min(2, len(self.slices))
        # Shared storages are numbered after the slices, each with a buffer of its own.
        self._storages = [*self.slices, *(storage for storage, _ in shared)]
        self._uses: dict[int, list[int]] = {index: [] for index in range(len(self.slices))}
        for offset, (_, users) in enumerate(shared):
            for user in users:
                self._uses[user].append(len(self.slices) + offset)
        self._buffers = [_Buffer() for _ in range(self._ping + len(shared))]
        self._grads: dict[int, _Gradients] = {}
        # Per storage, the event after the last store into its host memory (gradients,
        # running statistics): a load that reads that memory waits for it.
        self._stored: dict[int, Any] = {}
        # Host gradients, one pinned block per dtype laid out like the parameters' block
        # (see _storage.pack_in_blocks), and the storages whose part was handed out.
        self._grad_blocks: dict[torch.dtype, torch.Tensor] = {}
        self._grad_given: dict[torch.dtype, set[int]] = {}
        self.max_resident = 0
        self._capacity: list[dict[torch.dtype, int]] = [{} for _ in self._buffers]
        for index, storage in enumerate(self._storages):
            capacity = self._capacity[self._parity(index)]
            for dtype, flat in storage.flats.items():
                capacity[dtype] = max(capacity.get(dtype, 0), flat.numel, 1)

    def _parity(self, index: int) -> int:
        if index >= len(self.slices):
            return self._ping + index - len(self.slices)
        return index % self._ping

    @property
    def resident(self) -> tuple[int, ...]:
        """Indices of the slices whose data is in (or on its way to) device memory."""
        holders = (b.holder for b in self._buffers[: self._ping] if b.holder is not None)
        return tuple(sorted(holders))

    @property
    def attached(self) -> tuple[int, ...]:
        """Indices of the slices and shared storages pointing at device memory now."""
        return tuple(sorted(b.holder for b in self._buffers if b.attached and b.holder is not None))

    def invalidate(self) -> None:
        """Forget what the buffers hold (host parameters may have changed since)."""
        for buffer in self._buffers:
            if not buffer.attached:
                buffer.holder = None

    def _device_tensors(
        self, buffer: _Buffer, parity: int, compute: Any
    ) -> dict[torch.dtype, torch.Tensor]:
        # Called on the copy stream, so the memory belongs to it; compute is told it uses it.
        for dtype, numel in self._capacity[parity].items():
            if dtype not in buffer.tensors:
                tensor = torch.empty(numel, dtype=dtype, device=self.device)
                self.transfers.used_by(tensor, compute)
                buffer.tensors[dtype] = tensor
                buffer.views.clear()
        return buffer.tensors

    def issue(self, index: int, *, grads: bool = False) -> None:
        """Start loading slice ``index`` and what it shares (a no-op for what is there).

        Args:
            index: The slice.
            grads: Also load its host gradients (for backward, so that accumulation
                happens on the device exactly as without offload).
        """
        self._issue(index, grads=grads)
        for shared in self._uses.get(index, ()):
            self._issue(shared, grads=grads)

    def _issue(self, index: int, *, grads: bool) -> None:
        parity = self._parity(index)
        buffer = self._buffers[parity]
        storage = self._storages[index]
        if buffer.holder != index:
            if buffer.attached:
                raise AssertionError(
                    f"offload internal error: loading {storage.name} over slice "
                    f"{buffer.holder}, which is attached"
                )
            buffer.holder = index
            if self.copy:
                self.transfers.copy_waits(buffer.done)
                self.transfers.copy_waits(self._stored.get(index))
                with self.transfers.on_copy_stream() as compute:
                    tensors = self._device_tensors(buffer, parity, compute)
                    for dtype, flat in storage.flats.items():
                        assert flat.host is not None
                        tensors[dtype][: flat.numel].copy_(
                            flat.host[: flat.numel], non_blocking=self.transfers.non_blocking
                        )
                buffer.loaded = self.transfers.copy_event()
            self.max_resident = max(self.max_resident, len(self.resident))
        if grads and index not in self._grads:
            if self.copy:
                self.transfers.copy_waits(self._stored.get(index))
            self._grads[index] = self._load_grads(storage)
            if self.copy:
                buffer.loaded = self.transfers.copy_event()

    def _load_grads(self, storage: SliceStorage) -> _Gradients:
        gradients = _Gradients()
        if not self.copy:
            return gradients
        with self.transfers.on_copy_stream() as compute:
            for parameter in storage.parameters:
                host = parameter.grad
                if host is None:
                    continue
                device = torch.empty_strided(
                    parameter.shape, dense_stride(parameter), dtype=host.dtype, device=self.device
                )
                device.copy_(host, non_blocking=self.transfers.non_blocking)
                self.transfers.used_by(device, compute)
                gradients.device[id(parameter)] = device
        return gradients

    def _views(self, buffer: _Buffer, storage: SliceStorage) -> list[torch.Tensor]:
        views = buffer.views.get(storage.index)
        if views is None:
            views = [
                entry.view(buffer.tensors[dtype])
                for dtype, flat in storage.flats.items()
                for entry in flat.entries
            ]
            buffer.views[storage.index] = views
        return views

    def attach(self, index: int, *, grads: bool = False) -> None:
        """Point slice ``index``'s modules (and what it shares) at their device copies.

        Host gradients are set aside while attached; with ``grads`` the device copies
        loaded by :meth:`issue` take their place.
        """
        self._attach(index, grads=grads)
        for shared in self._uses.get(index, ()):
            # Loaded now if a neighbour's backward took the gradients loaded for it.
            self._issue(shared, grads=grads)
            self._attach(shared, grads=grads)

    def _attach(self, index: int, *, grads: bool) -> None:
        buffer = self._buffers[self._parity(index)]
        storage = self._storages[index]
        if buffer.holder != index:
            raise AssertionError(f"offload internal error: {storage.name} attached before load")
        buffer.attached = True
        if not self.copy:
            if grads:
                # Nothing moves, but backward accumulates from zero and the earlier
                # gradient is added back afterwards, so a failing backward can undo it.
                stash = _Gradients()
                for parameter in storage.parameters:
                    stash.stashed[id(parameter)] = parameter.grad
                    parameter.grad = None
                self._grads[index] = stash
            return
        self.transfers.compute_waits(buffer.loaded)
        gradients = self._grads.get(index) if grads else None
        stash = _Gradients() if gradients is None else gradients
        self._grads[index] = stash
        for parameter in storage.parameters:
            stash.stashed[id(parameter)] = parameter.grad
            parameter.grad = None
        entries = [entry for flat in storage.flats.values() for entry in flat.entries]
        for entry, view in zip(entries, self._views(buffer, storage), strict=True):
            entry.tensor.data = view
        for parameter in storage.parameters:
            device_grad = stash.device.get(id(parameter))
            if device_grad is not None:
                parameter.grad = device_grad

    def detach(self, index: int, *, grads_to_host: bool, buffers_to_host: bool) -> None:
        """Point slice ``index``'s modules (and what it shares) back at host memory.

        Args:
            index: The slice.
            grads_to_host: Copy the device gradients into the host gradients (after a
                successful backward). Otherwise they are dropped and the host gradients
                set aside by :meth:`attach` come back unchanged.
            buffers_to_host: Copy the device buffers (running statistics) to the host.
        """
        for shared in self._uses.get(index, ()):
            self._detach(shared, grads_to_host=grads_to_host, buffers_to_host=buffers_to_host)
        self._detach(index, grads_to_host=grads_to_host, buffers_to_host=buffers_to_host)

    def _detach(self, index: int, *, grads_to_host: bool, buffers_to_host: bool) -> None:
        buffer = self._buffers[self._parity(index)]
        storage = self._storages[index]
        if buffer.holder != index or not buffer.attached:
            return
        buffer.attached = False
        stash = self._grads.pop(index, _Gradients())
        if not self.copy:
            for parameter in storage.parameters:
                if id(parameter) not in stash.stashed:
                    continue
                earlier, new = stash.stashed[id(parameter)], parameter.grad
                if not grads_to_host or new is None:
                    parameter.grad = earlier
                elif earlier is not None:
                    with torch.no_grad():
                        parameter.grad = earlier.add_(new)  # as autograd accumulates
            return
        buffer.done = self.transfers.compute_event()
        new_grads: dict[int, torch.Tensor] = {}
        for parameter in storage.parameters:
            if grads_to_host and parameter.grad is not None:
                new_grads[id(parameter)] = parameter.grad
            parameter.grad = None
        for entry in storage.entries():
            entry.tensor.data = entry.home
        hosts = self._host_grads(storage, stash, new_grads)
        copies = (buffers_to_host and bool(storage.buffers)) or bool(new_grads)
        if copies:
            read_buffer = False
            self.transfers.copy_waits(buffer.done, store=True)
            with self.transfers.on_copy_stream(store=True):
                if buffers_to_host:
                    for dtype, flat in storage.flats.items():
                        if flat.buffers_start < flat.numel:
                            assert flat.host is not None
                            start, stop = flat.buffers_start, flat.numel
                            flat.host[start:stop].copy_(
                                buffer.tensors[dtype][start:stop],
                                non_blocking=self.transfers.non_blocking,
                            )
                            read_buffer = True
                for key, device_grad in new_grads.items():
                    hosts[key].copy_(device_grad, non_blocking=self.transfers.non_blocking)
                    self.transfers.used_by(device_grad, self.transfers.store_stream)
            stored = self.transfers.copy_event(store=True)
            self._stored[index] = stored
            if read_buffer:
                buffer.done = stored  # the next load into this buffer waits for the read
        for parameter in storage.parameters:
            parameter.grad = hosts.get(id(parameter), stash.stashed.get(id(parameter)))

    def _host_grads(
        self, storage: SliceStorage, stash: _Gradients, new_grads: dict[int, torch.Tensor]
    ) -> dict[int, torch.Tensor]:
        """The host tensor each new gradient goes to.

        The host gradient the user holds receives it in place (as autograd accumulates
        into an existing ``.grad``); a parameter without one gets a view of a new flat
        tensor, so a gradient handed out earlier is never written again.
        """
        hosts: dict[int, torch.Tensor] = {}
        fresh: dict[torch.dtype, torch.Tensor] = {}
        for entry in storage.entries():
            key = id(entry.tensor)
            if key not in new_grads:
                continue
            held = stash.stashed.get(key)
            if held is not None:
                hosts[key] = held
                continue
            dtype = entry.tensor.dtype
            if dtype not in fresh:
                fresh[dtype] = self._fresh_grads(storage, dtype)
            hosts[key] = entry.view(fresh[dtype])
        return hosts

    def _fresh_grads(self, storage: SliceStorage, dtype: torch.dtype) -> torch.Tensor:
        """Host memory for ``storage``'s new gradients of ``dtype``, never handed out before.

        A storage placed in a shared block gets its part of a gradient block of the same
        layout: one pinned allocation per dtype and pass instead of one per slice (each
        rounded up to a power of two by torch's host allocator). The block is forgotten
        once every trainable storage had its part, so that it is freed (and its cached
        memory reused by the next pass) as soon as the gradients are dropped.
        """
        numel = max(storage.flats[dtype].numel, 1)
        if dtype not in storage.block:
            return self.transfers.empty_host((numel,), dtype)
        offset, total = storage.block[dtype]
        given = self._grad_given.setdefault(dtype, set())
        block = self._grad_blocks.get(dtype)
        if block is None or id(storage) in given:
            block = self.transfers.empty_host((total,), dtype)
            self._grad_blocks[dtype] = block
            given.clear()
        given.add(id(storage))
        wanting = {
            id(other)
            for other in self._storages
            if dtype in other.flats
            and any(e.is_parameter and e.tensor.requires_grad for e in other.flats[dtype].entries)
        }
        if wanting <= given:
            del self._grad_blocks[dtype]
            given.clear()
        return block.narrow(0, offset, numel)

    def drop_pending(self) -> None:
        """Forget gradients loaded for slices that were never attached."""
        attached = set(self.attached)
        for index in [index for index in self._grads if index not in attached]:
            del self._grads[index]

    def release_all(self, *, buffers_to_host: bool) -> None:
        """Bring every attached slice home (gradients as before), forget the rest."""
        for index in self.attached:
            self._detach(index, grads_to_host=False, buffers_to_host=buffers_to_host)
        self._grads.clear()
        for buffer in self._buffers:
            buffer.holder = None
        self.transfers.wait_host()
