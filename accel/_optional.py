"""Defaults for the optional :class:`accel.Accelerator` members.

An optional member is one a backend may leave out; the algorithms call it through the
function here, which uses the backend's own member where it has one and otherwise a
default that is right for every backend that was complete before the member existed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ._protocol import Accelerator, RecomputeBarrier

if TYPE_CHECKING:
    import torch

__all__ = ["recompute_barrier"]


def recompute_barrier(backend: Accelerator, tensors: Sequence[torch.Tensor]) -> None:
    """Fence a recomputation's inputs from the forward, through ``backend``.

    Calls ``backend.recompute_barrier(tensors)`` where the backend defines it
    (:class:`accel.RecomputeBarrier`). Otherwise calls ``backend.mark_step()``, what
    checkpointing did before the member existed: on a lazy backend the forward then runs
    as a graph of its own, which no compiler can merge with the recomputation; on an
    eager backend ``mark_step`` does nothing.

    Args:
        backend: The backend the recomputation runs on.
        tensors: The recomputation's tensor inputs (and the gradients arriving at it,
            where known). Non-tensors must already be filtered out.
    """
    if isinstance(backend, RecomputeBarrier):
        backend.recompute_barrier(list(tensors))
    else:
        backend.mark_step()
