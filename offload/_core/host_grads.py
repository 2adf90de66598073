"""Where the gradients of an :class:`offload.OffloadModel` land in host memory.

The host gradient the user holds receives a new gradient in place (as autograd
accumulates into an existing ``.grad``); a parameter without one gets a view of new
host memory, so a gradient handed out earlier is never written again. Storages placed in
one pinned block (:func:`offload._core.storage.pack_in_blocks`) get their parts of a gradient
block of the same layout: one pinned allocation per dtype and pass instead of one per
slice (each rounded up to a power of two by torch's host allocator).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .storage import SliceStorage
from .transfer import Transfers

__all__ = ["HostGradients"]


class HostGradients:
    """Hands out host memory for new gradients, one pinned block per dtype and pass.

    Args:
        storages: Every storage of the model (the slices, then shared ones).
        transfers: Allocates the page-locked memory.
    """

    def __init__(self, storages: Sequence[SliceStorage], transfers: Transfers) -> None:
        self._storages = list(storages)
        self._transfers = transfers
        self._blocks: dict[torch.dtype, torch.Tensor] = {}
        self._given: dict[torch.dtype, set[int]] = {}

    def destinations(
        self,
        storage: SliceStorage,
        held: dict[int, torch.Tensor | None],
        new_grads: dict[int, torch.Tensor],
    ) -> dict[int, torch.Tensor]:
        """The host tensor each of ``new_grads`` (by parameter id) goes to.

        Args:
            storage: The storage whose parameters they are.
            held: The host gradients the parameters had before (``None``: none).
            new_grads: The device gradients to bring home.
        """
        hosts: dict[int, torch.Tensor] = {}
        fresh: dict[torch.dtype, torch.Tensor] = {}
        for entry in storage.entries():
            key = id(entry.tensor)
            if key not in new_grads:
                continue
            before = held.get(key)
            if before is not None:
                hosts[key] = before
                continue
            dtype = entry.tensor.dtype
            if dtype not in fresh:
                fresh[dtype] = self._fresh(storage, dtype)
            hosts[key] = entry.view(fresh[dtype])
        return hosts

    def _fresh(self, storage: SliceStorage, dtype: torch.dtype) -> torch.Tensor:
        """Host memory for ``storage``'s new gradients of ``dtype``, never handed out before.

        The block is forgotten once every trainable storage had its part, so that it is
        freed (and its cached memory reused by the next pass) as soon as the gradients
        are dropped.
        """
        numel = max(storage.flats[dtype].numel, 1)
        if dtype not in storage.block:
            return self._transfers.empty_host((numel,), dtype)
        offset, total = storage.block[dtype]
        given = self._given.setdefault(dtype, set())
        block = self._blocks.get(dtype)
        if block is None or id(storage) in given:
            block = self._transfers.empty_host((total,), dtype)
            self._blocks[dtype] = block
            given.clear()
        given.add(id(storage))
        wanting = {
            id(other)
            for other in self._storages
            if dtype in other.flats
            and any(e.is_parameter and e.tensor.requires_grad for e in other.flats[dtype].entries)
        }
        if wanting <= given:
            del self._blocks[dtype]
            given.clear()
        return block.narrow(0, offset, numel)
