"""The pinned host buffers of offloaded activations: allocated once per size, reused.

Pinned memory allocated as tensors arrive each step stops the copies from overlapping
compute (torchtune #2076); a :class:`HostPool` per backend hands the same buffers out
again every step, under a cap in bytes that the plan records.
"""

from __future__ import annotations

import threading

import torch

from accel import Accelerator

__all__ = ["HostPool", "host_pool"]


class HostPool:
    """Page-locked host buffers kept for reuse, by size, under a cap in bytes.

    Where a new size would pass the cap, the free buffers of other sizes are let go
    first, so inputs whose shapes change between steps do not fill it.

    Args:
        backend: The backend whose ``empty_pinned`` allocates.
        cap_bytes: The most host bytes the pool allocates in all.
    """

    def __init__(self, backend: Accelerator, cap_bytes: int) -> None:
        self.backend = backend
        self.cap_bytes = cap_bytes
        self.allocated_bytes = 0
        self.in_use = 0
        self._free: dict[int, list[torch.Tensor]] = {}
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> torch.Tensor | None:
        """A host buffer of ``nbytes`` bytes, or ``None`` past the cap or where pinning fails."""
        with self._lock:
            free = self._free.get(nbytes)
            if free:
                self.in_use += 1
                return free.pop()
            if self.allocated_bytes + nbytes > self.cap_bytes:
                # Buffers of other sizes (shapes that changed) are let go before refusing.
                self.allocated_bytes -= sum(b.numel() for f in self._free.values() for b in f)
                self._free.clear()
            if self.allocated_bytes + nbytes > self.cap_bytes:
                return None
            try:
                buffer = self.backend.empty_pinned((nbytes,), torch.uint8)
            except RuntimeError:
                return None
            self.allocated_bytes += nbytes
            self.in_use += 1
            return buffer

    def give(self, buffer: torch.Tensor) -> None:
        """Return ``buffer`` for reuse."""
        with self._lock:
            self.in_use -= 1
            self._free.setdefault(buffer.numel(), []).append(buffer)


_pools_lock = threading.Lock()
_pools: dict[int, tuple[Accelerator, HostPool]] = {}


def host_pool(backend: Accelerator, cap_bytes: int) -> HostPool:
    """The process's pool for ``backend``; its cap is the largest any plan asked for."""
    with _pools_lock:
        entry = _pools.get(id(backend))
        if entry is None or entry[0] is not backend:
            entry = (backend, HostPool(backend, cap_bytes))
            _pools[id(backend)] = entry
        pool = entry[1]
        pool.cap_bytes = max(pool.cap_bytes, cap_bytes)
        return pool
