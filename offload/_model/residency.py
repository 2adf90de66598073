"""Which slices are in device memory: double-buffered loading, and tied tensors.

:class:`Residency` owns two device buffers per dtype ("ping-pong"), each as large as
the largest slice that uses it: slice ``i`` always loads into buffer ``i % 2``. At most
two slices are therefore in device memory at any time, loading slice ``i + 1`` overlaps
with computing slice ``i``, and tensors that autograd saved from slice ``i``'s
parameters are valid again whenever slice ``i`` is loaded for its backward. A buffer is
refilled only after the compute stream is done with its previous slice (an event), and
compute uses a slice only after its copy finished (another event). While a slice is
attached for backward its gradients' places in the buffer are open in
:attr:`Residency.destinations`, where the layers write them (:mod:`offload._core.grads`).

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

from .._core.grads import Destination, Destinations, standalone
from .._core.host_grads import HostGradients
from .._core.storage import SliceStorage
from .._core.transfer import Transfers

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
    # The gradients of the slice in it, laid out as its parameters, and the event after
    # the last store that read them (the next slice's gradients wait for it).
    grads: dict[torch.dtype, torch.Tensor] = field(default_factory=dict)
    grads_read: Any = None
    grad_views: dict[int, dict[int, torch.Tensor]] = field(default_factory=dict)


@dataclass
class _Gradients:
    """A slice's gradients while it is attached: device copies and the host ones set aside."""

    device: dict[int, torch.Tensor] = field(default_factory=dict)
    stashed: dict[int, torch.Tensor | None] = field(default_factory=dict)
    # Each device gradient's version after loading: backward accumulated into the
    # parameters whose version moved (the others had no gradient, or kept the host one).
    versions: dict[int, int] = field(default_factory=dict)
    loaded: set[int] = field(default_factory=set)

    def produced(self) -> dict[int, torch.Tensor]:
        """The device gradients that hold a result: accumulated into, or loaded."""
        return {
            key: grad
            for key, grad in self.device.items()
            if key in self.loaded or grad._version != self.versions.get(key)
        }


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
        self._host = HostGradients(self._storages, transfers)
        #: Where backward writes each parameter's gradient while its slice is attached.
        self.destinations = Destinations()
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
            self._grads[index] = self._load_grads(storage, buffer, self._parity(index))
            if self.copy:
                buffer.loaded = self.transfers.copy_event()

    def _load_grads(self, storage: SliceStorage, buffer: _Buffer, parity: int) -> _Gradients:
        """Zero the buffer's gradients for ``storage``, then load the host ones into them.

        The gradient buffer is allocated once per dtype (as large as the parameters'),
        so backward accumulates into the same device memory every step, as the plain
        model accumulates into an existing ``.grad``.
        """
        gradients = _Gradients()
        if not self.copy:
            return gradients
        self.transfers.copy_waits(buffer.grads_read)
        with self.transfers.on_copy_stream() as compute:
            for dtype, numel in self._capacity[parity].items():
                if dtype not in buffer.grads:
                    buffer.grads[dtype] = torch.empty(numel, dtype=dtype, device=self.device)
                    self.transfers.used_by(buffer.grads[dtype], compute)
                    buffer.grad_views.clear()
            views = self._grad_views(buffer, storage)
            for dtype, flat in storage.flats.items():
                if any(id(entry.tensor) in views for entry in flat.entries):
                    buffer.grads[dtype][: flat.buffers_start].zero_()
            for parameter in storage.parameters:
                device = views.get(id(parameter))
                if device is None:
                    continue
                host = parameter.grad
                if host is not None:
                    device.copy_(host, non_blocking=self.transfers.non_blocking)
                    gradients.loaded.add(id(parameter))
                gradients.device[id(parameter)] = device
                gradients.versions[id(parameter)] = device._version
        return gradients

    def _grad_views(self, buffer: _Buffer, storage: SliceStorage) -> dict[int, torch.Tensor]:
        """``storage``'s trainable parameters' gradients in the buffer, by parameter id.

        Each is a tensor of its own on the buffer's memory (``set_``, not a view), so its
        version counter moves only when backward accumulates into it.
        """
        views = buffer.grad_views.get(storage.index)
        if views is None:
            views = {}
            for dtype, flat in storage.flats.items():
                for entry in flat.entries:
                    if entry.is_parameter and entry.tensor.requires_grad:
                        views[id(entry.tensor)] = standalone(entry.view(buffer.grads[dtype]))
            buffer.grad_views[storage.index] = views
        return views

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
            key = id(parameter)
            device_grad = stash.device.get(key)
            if device_grad is not None:
                parameter.grad = device_grad
                empty = None if key in stash.loaded else device_grad._version
                self.destinations.open(key, Destination(device_grad, empty))

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
        produced = stash.produced() if grads_to_host else {}
        new_grads: dict[int, torch.Tensor] = {}
        for parameter in storage.parameters:
            grad, key = parameter.grad, id(parameter)
            self.destinations.close(key)
            # Skipped: a gradient buffer backward did not reach (the plain model's stays None).
            if (
                grads_to_host
                and grad is not None
                and (grad is not stash.device.get(key) or key in produced)
            ):
                new_grads[key] = grad
            parameter.grad = None
        for entry in storage.entries():
            entry.tensor.data = entry.home
        hosts = self._host.destinations(storage, stash.stashed, new_grads)
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
            if new_grads:
                buffer.grads_read = stored
            if read_buffer:
                buffer.done = stored  # the next load into this buffer waits for the read
        for parameter in storage.parameters:
            parameter.grad = hosts.get(id(parameter), stash.stashed.get(id(parameter)))

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
