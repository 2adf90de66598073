"""A dispatch-level tracer of the device memory a region of code allocates.

:class:`Allocations` is a ``TorchDispatchMode``: every operator that returns a tensor on
memory none of its inputs held (``mm``, ``cat``, ``_to_copy``, ``empty``...) created a new
tensor, and it records which operator, how many bytes and on which device. It also keeps
a weak reference to each new storage, so that it knows the device bytes still alive after
every operator (:attr:`Allocations.peak_live_bytes`): on a device without memory
counters (PyTorch's openreg) that is the measure of what the region made the allocator
hand out at once.

On the host the device and the offload device are the same memory, so host memory cannot
be told apart by its device: :class:`HostMarkingCpu` is a CPU backend whose page-locked
("pinned") allocations, offload's host memory for gradients, are marked as host memory,
and so is what an operator computes from host memory alone (autograd summing two host
gradients of a parameter). Everything else the region allocates is device memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten

from backends.cpu import CpuBackend

__all__ = ["Allocation", "Allocations", "HostMarkingCpu"]


@dataclass(frozen=True)
class Allocation:
    """One new tensor: the operator that made it, its storage's bytes, its device."""

    op: str
    nbytes: int
    device: torch.device


class Allocations(TorchDispatchMode):
    """Record the new tensors on ``device_type`` that operators create while active.

    Args:
        device_type: Which device's memory to count (``"cpu"`` on the host).
    """

    def __init__(self, device_type: str) -> None:
        super().__init__()
        self.device_type = device_type
        self.records: list[Allocation] = []
        self._alive: list[tuple[StorageWeakRef, int]] = []
        self.peak_live_bytes = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        result = func(*args, **(kwargs or {}))
        inputs = [
            t
            for t in tree_flatten((args, kwargs))[0]
            if isinstance(t, torch.Tensor) and t.device.type == self.device_type
        ]
        held = {t.untyped_storage().data_ptr() for t in inputs}
        from_host = bool(inputs) and all(_is_host(t) for t in inputs)
        for out in tree_flatten(result)[0]:
            if not isinstance(out, torch.Tensor) or out.device.type != self.device_type:
                continue
            storage = out.untyped_storage()
            if storage.nbytes() == 0 or storage.data_ptr() in held:
                continue
            held.add(storage.data_ptr())
            if from_host:
                _mark_host(out)
                continue
            self.records.append(Allocation(str(func.overloadpacket), storage.nbytes(), out.device))
            self._alive.append((StorageWeakRef(storage), storage.nbytes()))
        self._alive = [(ref, nbytes) for ref, nbytes in self._alive if not ref.expired()]
        self.peak_live_bytes = max(self.peak_live_bytes, sum(n for _, n in self._alive))
        return result

    def at_least(self, nbytes: int) -> list[Allocation]:
        """The new tensors of ``nbytes`` or more."""
        return [record for record in self.records if record.nbytes >= nbytes]

    def ops(self, nbytes: int) -> list[str]:
        """The operators that made them, sorted (for an assertion's message)."""
        return sorted(record.op for record in self.at_least(nbytes))


_HOST: dict[int, StorageWeakRef] = {}


def _mark_host(tensor: torch.Tensor) -> None:
    _HOST[tensor.untyped_storage().data_ptr()] = StorageWeakRef(tensor.untyped_storage())


def _is_host(tensor: torch.Tensor) -> bool:
    storage = tensor.untyped_storage()
    ref = _HOST.get(storage.data_ptr())
    return ref is not None and not ref.expired() and ref.cdata == storage._cdata


class HostMarkingCpu(CpuBackend):
    """The CPU backend whose page-locked memory (host memory here) no tracer counts."""

    def empty_pinned(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        with _disable_current_modes():
            tensor = torch.empty(tuple(shape), dtype=dtype)
        _mark_host(tensor)
        return tensor
