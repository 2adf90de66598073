"""How :class:`offload.OffloadModel` cuts a model into slices and packs them.

:func:`partition` splits the layers into contiguous runs balanced by parameter bytes;
:func:`pack_slices` packs each run's parameters and buffers into host memory
(:class:`offload._core.storage.SliceStorage`), tensors used by several slices (tied
weights) once, in a storage of their own.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .._core.storage import SliceStorage, pack_in_blocks
from .._core.transfer import Transfers

__all__ = ["pack_slices", "partition"]


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


def pack_slices(
    layers: Sequence[nn.Module], runs: Sequence[range], transfers: Transfers, *, copy: bool
) -> tuple[list[SliceStorage], list[tuple[SliceStorage, list[int]]]]:
    """Pack each slice of :class:`offload.OffloadModel`; tied tensors are packed once, apart.

    Returns:
        The slices' storages, and each storage of tensors used by several slices with
        the indices of those slices.
    """
    users: dict[int, list[int]] = {}
    tensors: dict[int, torch.Tensor] = {}
    for index, run in enumerate(runs):
        for layer in layers[run.start : run.stop]:
            for tensor in [*layer.parameters(), *layer.buffers()]:
                tensors[id(tensor)] = tensor
                slices = users.setdefault(id(tensor), [])
                if index not in slices:
                    slices.append(index)
    groups: dict[tuple[int, ...], list[torch.Tensor]] = {}
    for key, slices in users.items():
        if len(slices) > 1:
            groups.setdefault(tuple(slices), []).append(tensors[key])
    storages = []
    for index, run in enumerate(runs):
        chunk = layers[run.start : run.stop]
        last = run.stop - 1
        span = f"layer {run.start}" if last == run.start else f"layers {run.start}-{last}"
        storages.append(
            SliceStorage(
                index,
                f"slice {index} ({span})",
                chunk,
                [p for layer in chunk for p in layer.parameters() if len(users[id(p)]) == 1],
                [b for layer in chunk for b in layer.buffers() if len(users[id(b)]) == 1],
                transfers,
                copy=copy,
                allocate=False,
            )
        )
    shared = []
    for number, (users_of, group) in enumerate(groups.items()):
        names = ", ".join(str(k) for k in users_of)
        storage = SliceStorage(
            len(runs) + number,
            f"tensors shared by slices {names}",
            [],
            [t for t in group if isinstance(t, nn.Parameter)],
            [t for t in group if not isinstance(t, nn.Parameter)],
            transfers,
            copy=copy,
            allocate=False,
        )
        for k in users_of:
            # A slice whose only trainable parameters are shared still needs its backward.
            storages[k].trainable = storages[k].trainable or storage.trainable
        shared.append((storage, list(users_of)))
    if copy:
        pack_in_blocks([*storages, *(storage for storage, _ in shared)], transfers)
    return storages, shared
