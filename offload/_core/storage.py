"""Host storage: parameters and buffers packed into flat page-locked tensors.

Both wrappers pack what they offload (a slice of :class:`offload.OffloadModel`, a unit of
:func:`offload.offload_parameters`) into one flat host tensor per dtype
(:class:`SliceStorage`); the modules' tensors become views into it, so the optimizer
updates the packed copy in place.

:func:`pack_in_blocks` places every slice of a model in one page-locked block per dtype.
torch's pinned host allocator rounds each request up to a power of two (and caches
freed blocks by that size), so a flat of 512.08 MiB per slice would take 1 GiB: one
block per dtype pays the rounding once instead of once per slice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .transfer import Transfers, dense_stride

__all__ = ["FlatLayout", "SliceStorage", "lay_out", "pack_in_blocks"]

# Offsets inside a flat buffer are rounded up to this many bytes, the alignment torch's
# allocators give a fresh tensor, so kernels see the alignment they would see anyway.
_ALIGN_BYTES = 64


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
        # as_strided's offset counts from the storage: a flat placed in a block is a view.
        return flat.as_strided(self.size, self.stride, flat.storage_offset() + self.offset)


def _span(size: torch.Size, stride: tuple[int, ...]) -> int:
    return 1 + sum((extent - 1) * step for extent, step in zip(size, stride, strict=True))


@dataclass
class FlatLayout:
    """The entries of one dtype and the flat host tensor holding them."""

    dtype: torch.dtype
    entries: list[_Entry] = field(default_factory=list)
    numel: int = 0
    buffers_start: int = 0
    host: torch.Tensor | None = None

    def add(self, tensor: torch.Tensor, is_parameter: bool) -> None:
        align = max(1, _ALIGN_BYTES // tensor.element_size())
        offset = -(-self.numel // align) * align
        stride = dense_stride(tensor)
        self.entries.append(_Entry(tensor, offset, tensor.shape, stride, is_parameter))
        self.numel = offset + (_span(tensor.shape, stride) if tensor.numel() else 0)


def lay_out(tensors: Sequence[torch.Tensor]) -> dict[torch.dtype, FlatLayout]:
    """Where each of ``tensors`` would go in a flat tensor of its dtype (nothing allocated).

    Each is placed at an aligned offset with its dense strides, as in :class:`SliceStorage`.
    """
    flats: dict[torch.dtype, FlatLayout] = {}
    for tensor in tensors:
        flats.setdefault(tensor.dtype, FlatLayout(tensor.dtype)).add(tensor, is_parameter=True)
    for flat in flats.values():
        flat.buffers_start = flat.numel
    return flats


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
        allocate: Whether to allocate this storage's own flat tensors now; ``False``
            lays them out only, for :func:`pack_in_blocks` to place.
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
        allocate: bool = True,
    ) -> None:
        self.index = index
        self.name = name
        self.layers = list(layers)
        self.parameters: list[nn.Parameter] = _unique(parameters)
        self.buffers: list[torch.Tensor] = _unique(buffers)
        self.flats: dict[torch.dtype, FlatLayout] = {}
        #: Per dtype, (offset, block numel) of this storage's flat inside the block
        #: :func:`pack_in_blocks` placed it in; empty for a storage allocated alone.
        self.block: dict[torch.dtype, tuple[int, int]] = {}
        self.trainable = any(p.requires_grad for p in self.parameters)
        if copy:
            self._lay_out()
            if allocate:
                self.place(
                    {
                        dtype: transfers.empty_host((max(flat.numel, 1),), dtype).zero_()
                        for dtype, flat in self.flats.items()
                    }
                )

    @property
    def nbytes(self) -> int:
        """Bytes of the slice's parameters and buffers."""
        tensors = [*self.parameters, *self.buffers]
        return sum(t.numel() * t.element_size() for t in tensors)

    def _lay_out(self) -> None:
        for is_parameter, tensors in ((True, self.parameters), (False, self.buffers)):
            for tensor in tensors:
                flat = self.flats.setdefault(tensor.dtype, FlatLayout(tensor.dtype))
                flat.add(tensor, is_parameter)
        for flat in self.flats.values():
            parameter_ends = [
                e.offset + _span(e.size, e.stride) for e in flat.entries if e.is_parameter
            ]
            flat.buffers_start = max(parameter_ends, default=0)

    def place(self, hosts: dict[torch.dtype, torch.Tensor]) -> None:
        """Copy the tensors into ``hosts`` (zeroed, ``max(numel, 1)`` long, per dtype).

        The modules' tensors become views into them.
        """
        for dtype, flat in self.flats.items():
            host = hosts[dtype]
            for entry in flat.entries:
                with torch.no_grad():
                    entry.view(host).copy_(entry.tensor.detach())
            flat.host = host
            for entry in flat.entries:
                entry.home = entry.view(host)
                entry.tensor.data = entry.home
                if entry.is_parameter and entry.tensor.grad is not None:
                    entry.tensor.grad = entry.tensor.grad.to(host.device)

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


def pack_in_blocks(storages: Sequence[SliceStorage], transfers: Transfers) -> None:
    """Place every storage (laid out with ``allocate=False``) in one pinned block per dtype.

    Each storage's flat is a view of the block at an aligned offset, recorded in
    :attr:`SliceStorage.block` (gradient blocks reuse the layout).
    """
    totals: dict[torch.dtype, int] = {}
    offsets: list[dict[torch.dtype, int]] = []
    for storage in storages:
        placed = {}
        for dtype, flat in storage.flats.items():
            align = max(1, _ALIGN_BYTES // dtype.itemsize)
            placed[dtype] = -(-totals.get(dtype, 0) // align) * align
            totals[dtype] = placed[dtype] + max(flat.numel, 1)
        offsets.append(placed)
    blocks = {
        dtype: transfers.empty_host((total,), dtype).zero_() for dtype, total in totals.items()
    }
    for storage, placed in zip(storages, offsets, strict=True):
        storage.block = {dtype: (offset, totals[dtype]) for dtype, offset in placed.items()}
        storage.place(
            {
                dtype: blocks[dtype].narrow(0, offset, max(storage.flats[dtype].numel, 1))
                for dtype, offset in placed.items()
            }
        )


def _unique(tensors: Any) -> list[Any]:
    seen: set[int] = set()
    unique = []
    for tensor in tensors:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            unique.append(tensor)
    return unique
