"""Slices of a sequential model: splitting, host storage, and double-buffered loading.

A model is split into contiguous slices balanced by parameter bytes
(:func:`partition`). Each slice's parameters and buffers are packed into one flat host
tensor per dtype, allocated page-locked once (:class:`SliceStorage`); the modules' tensors become
views into it, so the optimizer updates the packed copy in place.

:class:`Residency` owns two device buffers per dtype ("ping-pong"), each as large as
the largest slice that uses it: slice ``i`` always loads into buffer ``i % 2``. At most
two slices are therefore in device memory at any time, loading slice ``i + 1`` overlaps
with computing slice ``i``, and tensors that autograd saved from slice ``i``'s
parameters are valid again whenever slice ``i`` is loaded for its backward. A buffer is
refilled only after the compute stream is done with its previous slice (an event), and
compute uses a slice only after its copy finished (another event).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ._transfer import Transfers, dense_stride

__all__ = ["Residency", "SliceStorage", "partition"]

# Offsets inside a flat buffer are rounded up to this many bytes, the alignment torch's
# allocators give a fresh tensor, so kernels see the alignment they would see anyway.
_ALIGN_BYTES = 64


def partition(sizes: Sequence[int], parts: int) -> list[range]:
    """Split ``len(sizes)`` items into ``parts`` contiguous, non-empty runs.

    The largest run total is as small as possible (the runs are balanced by size).

    Args:
        sizes: Non-negative item sizes (parameter bytes per layer).
        parts: How many runs; ``1 <= parts <= len(sizes)``.

    Returns:
        The runs, as index ranges in order.
    """
    count = len(sizes)
    if not 1 <= parts <= count:
        raise ValueError(f"cannot split {count} items into {parts} non-empty runs")

    def runs_for(cap: int) -> list[range]:
        runs: list[range] = []
        start, total = 0, 0
        for index, size in enumerate(sizes):
            if index > start and total + size > cap:
                runs.append(range(start, index))
                start, total = index, 0
            total += size
        runs.append(range(start, count))
        return runs

    low, high = max(sizes, default=0), sum(sizes)
    while low < high:
        middle = (low + high) // 2
        if len(runs_for(middle)) <= parts:
            high = middle
        else:
            low = middle + 1
    runs = runs_for(low)
    while len(runs) < parts:
        # Split the longest run where the larger half is smallest; no run grows.
        position = max(range(len(runs)), key=lambda k: (len(runs[k]) > 1, len(runs[k])))
        run = runs[position]
        best = min(
            range(run.start + 1, run.stop),
            key=lambda cut: max(sum(sizes[run.start : cut]), sum(sizes[cut : run.stop])),
        )
        runs[position : position + 1] = [range(run.start, best), range(best, run.stop)]
    return runs


@dataclass
class _Entry:
    """One parameter or buffer's place in its slice's flat tensor of one dtype."""

    tensor: torch.Tensor
    offset: int
    size: torch.Size
    stride: tuple[int, ...]
    is_parameter: bool
    home: torch.Tensor = field(init=False)

    def view(self, flat: torch.Tensor) -> torch.Tensor:
        return flat.as_strided(self.size, self.stride, self.offset)


def _span(size: torch.Size, stride: tuple[int, ...]) -> int:
    return 1 + sum((extent - 1) * step for extent, step in zip(size, stride, strict=True))


@dataclass
class _Flat:
    """The entries of one dtype and the flat host tensor holding them."""

    dtype: torch.dtype
    entries: list[_Entry] = field(default_factory=list)
    numel: int = 0
    buffers_start: int = 0
    host: torch.Tensor | None = None
    host_grads: torch.Tensor | None = None

    def add(self, tensor: torch.Tensor, is_parameter: bool) -> None:
        align = max(1, _ALIGN_BYTES // tensor.element_size())
        offset = -(-self.numel // align) * align
        stride = dense_stride(tensor)
        self.entries.append(_Entry(tensor, offset, tensor.shape, stride, is_parameter))
        self.numel = offset + (_span(tensor.shape, stride) if tensor.numel() else 0)


class SliceStorage:
    """Parameters and buffers packed into flat host tensors, one per dtype, pinned once.

    Each tensor's ``.data`` becomes a view into its flat tensor (its "home"), keeping
    its shape and (dense) strides, so optimizers and ``load_state_dict`` update the
    packed copy in place.

    Args:
        index: The position of this storage among its siblings (the slice index).
        name: How messages name it (e.g. ``"slice 1 (layers 3-5)"``).
        layers: The modules it computes with.
        parameters: The parameters to pack (duplicates are ignored).
        buffers: The buffers to pack (duplicates are ignored).
        transfers: Used to pin the packed tensors.
        copy: Whether tensors move between host and device; ``False`` leaves them as
            they are (device and offload device are the same) and packs nothing.
    """

    def __init__(
        self,
        index: int,
        name: str,
        layers: Sequence[nn.Module],
        parameters: Sequence[nn.Parameter],
        buffers: Sequence[torch.Tensor],
        transfers: Transfers,
        *,
        copy: bool,
    ) -> None:
        self.index = index
        self.name = name
        self.layers = list(layers)
        self.parameters: list[nn.Parameter] = _unique(parameters)
        self.buffers: list[torch.Tensor] = _unique(buffers)
        self.flats: dict[torch.dtype, _Flat] = {}
        self.trainable = any(p.requires_grad for p in self.parameters)
        if copy:
            self._pack(transfers)

    @classmethod
    def for_layers(
        cls,
        index: int,
        layers: Sequence[nn.Module],
        first: int,
        transfers: Transfers,
        *,
        copy: bool,
    ) -> SliceStorage:
        """Pack every parameter and buffer of ``layers`` (a slice starting at layer ``first``)."""
        last = first + len(layers) - 1
        span = f"layer {first}" if last == first else f"layers {first}-{last}"
        return cls(
            index,
            f"slice {index} ({span})",
            layers,
            [p for layer in layers for p in layer.parameters()],
            [b for layer in layers for b in layer.buffers()],
            transfers,
            copy=copy,
        )

    @property
    def nbytes(self) -> int:
        """Bytes of the slice's parameters and buffers."""
        tensors = [*self.parameters, *self.buffers]
        return sum(t.numel() * t.element_size() for t in tensors)

    def _pack(self, transfers: Transfers) -> None:
        for is_parameter, tensors in ((True, self.parameters), (False, self.buffers)):
            for tensor in tensors:
                flat = self.flats.setdefault(tensor.dtype, _Flat(tensor.dtype))
                flat.add(tensor, is_parameter)
        for flat in self.flats.values():
            parameter_ends = [
                e.offset + _span(e.size, e.stride) for e in flat.entries if e.is_parameter
            ]
            flat.buffers_start = max(parameter_ends, default=0)
            host = transfers.empty_host((max(flat.numel, 1),), flat.dtype).zero_()
            for entry in flat.entries:
                with torch.no_grad():
                    entry.view(host).copy_(entry.tensor.detach())
            flat.host = host
            for entry in flat.entries:
                entry.home = entry.view(host)
                entry.tensor.data = entry.home
                if entry.is_parameter and entry.tensor.grad is not None:
                    entry.tensor.grad = entry.tensor.grad.to(host.device)

    def host_grad(self, entry: _Entry, transfers: Transfers) -> torch.Tensor:
        """Return the pinned host tensor that receives ``entry``'s gradient (made once)."""
        flat = self.flats[entry.tensor.dtype]
        if flat.host_grads is None:
            flat.host_grads = transfers.empty_host((max(flat.numel, 1),), flat.dtype).zero_()
        return entry.view(flat.host_grads)

    def entries(self) -> list[_Entry]:
        """Every packed entry, parameters and buffers, over all dtypes."""
        return [entry for flat in self.flats.values() for entry in flat.entries]

    def is_home(self) -> bool:
        """Whether every parameter and buffer is its packed host view (or untouched)."""
        return all(
            entry.tensor.data_ptr() == entry.home.data_ptr()
            and entry.tensor.device == entry.home.device
            for entry in self.entries()
        )


def _unique(tensors: Any) -> list[Any]:
    seen: set[int] = set()
    unique = []
    for tensor in tensors:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            unique.append(tensor)
    return unique


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
    """

    def __init__(
        self,
        slices: Sequence[SliceStorage],
        transfers: Transfers,
        device: torch.device,
        *,
        copy: bool,
    ) -> None:
        self.slices = list(slices)
        self.transfers = transfers
        self.device = device
        self.copy = copy
        self._buffers = [_Buffer() for _ in range(min(2, len(self.slices)))]
        self._grads: dict[int, _Gradients] = {}
        self.max_resident = 0
        self._capacity: list[dict[torch.dtype, int]] = [{} for _ in self._buffers]
        for storage in self.slices:
            capacity = self._capacity[self._parity(storage.index)]
            for dtype, flat in storage.flats.items():
                capacity[dtype] = max(capacity.get(dtype, 0), flat.numel, 1)

    def _parity(self, index: int) -> int:
        return index % len(self._buffers)

    @property
    def resident(self) -> tuple[int, ...]:
        """Indices of the slices whose data is in (or on its way to) device memory."""
        return tuple(sorted(b.holder for b in self._buffers if b.holder is not None))

    @property
    def attached(self) -> tuple[int, ...]:
        """Indices of the slices whose modules currently point at device memory."""
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
        """Start loading slice ``index`` (a no-op when it is already there).

        Args:
            index: The slice.
            grads: Also load its host gradients (for backward, so that accumulation
                happens on the device exactly as without offload).
        """
        parity = self._parity(index)
        buffer = self._buffers[parity]
        storage = self.slices[index]
        if buffer.holder != index:
            if buffer.attached:
                raise AssertionError(
                    f"offload internal error: loading {storage.name} over slice "
                    f"{buffer.holder}, which is attached"
                )
            buffer.holder = index
            if self.copy:
                self.transfers.copy_waits(buffer.done)
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
        """Point slice ``index``'s modules at its device copy (after waiting for the copy).

        Host gradients are set aside while attached; with ``grads`` the device copies
        loaded by :meth:`issue` take their place.
        """
        buffer = self._buffers[self._parity(index)]
        storage = self.slices[index]
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
        """Point slice ``index``'s modules back at host memory.

        Args:
            index: The slice.
            grads_to_host: Copy the device gradients into the host gradients (after a
                successful backward). Otherwise they are dropped and the host gradients
                set aside by :meth:`attach` come back unchanged.
            buffers_to_host: Copy the device buffers (running statistics) to the host.
        """
        buffer = self._buffers[self._parity(index)]
        storage = self.slices[index]
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
        copies = (buffers_to_host and bool(storage.buffers)) or bool(new_grads)
        if copies:
            self.transfers.copy_waits(buffer.done)
            with self.transfers.on_copy_stream():
                if buffers_to_host:
                    for dtype, flat in storage.flats.items():
                        if flat.buffers_start < flat.numel:
                            assert flat.host is not None
                            start, stop = flat.buffers_start, flat.numel
                            flat.host[start:stop].copy_(
                                buffer.tensors[dtype][start:stop],
                                non_blocking=self.transfers.non_blocking,
                            )
                for entry in storage.entries():
                    device_grad = new_grads.get(id(entry.tensor))
                    if device_grad is None:
                        continue
                    host = storage.host_grad(entry, self.transfers)
                    host.copy_(device_grad, non_blocking=self.transfers.non_blocking)
                    self.transfers.used_by(device_grad, self.transfers.stream)
            self.transfers.copy_event()
        for entry in storage.entries():
            if not entry.is_parameter:
                continue
            tensor = entry.tensor
            if id(tensor) in new_grads:
                tensor.grad = storage.host_grad(entry, self.transfers)
            else:
                tensor.grad = stash.stashed.get(id(tensor), tensor.grad)

    def drop_pending(self) -> None:
        """Forget gradients loaded for slices that were never attached."""
        attached = set(self.attached)
        for index in [index for index in self._grads if index not in attached]:
            del self._grads[index]

    def release_all(self, *, buffers_to_host: bool) -> None:
        """Bring every attached slice home (gradients as before), forget the rest."""
        for index in self.attached:
            self.detach(index, grads_to_host=False, buffers_to_host=buffers_to_host)
        self._grads.clear()
        for buffer in self._buffers:
            buffer.holder = None
        self.transfers.wait_host()
