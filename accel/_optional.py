"""Defaults for the optional :class:`accel.Accelerator` members.

An optional member is one a backend may leave out; the algorithms call it through the
function here, which uses the backend's own member where it has one and otherwise a
default that is right for every backend that was complete before the member existed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ._protocol import Accelerator, CopyEngines, RecomputeBarrier

if TYPE_CHECKING:
    import torch

__all__ = ["copy_engines", "recompute_barrier"]


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


def copy_engines(backend: Accelerator) -> int:
    """Return how many host-device copies can run at once on ``backend``'s device.

    ``backend.copy_engines`` where the backend defines it (:class:`accel.CopyEngines`);
    otherwise ``1`` for a backend with streams and ``0`` for one without, which keeps
    what algorithms did before the member existed (one copy stream, or copies in order).

    Args:
        backend: The backend to ask.

    Returns:
        A non-negative count; never above ``0`` where ``supports_streams`` is false.

    Example::

        import accel

        assert accel.copy_engines(accel.get_backend("cpu")) == 0
    """
    if not backend.supports_streams:
        return 0
    engines = backend.copy_engines if isinstance(backend, CopyEngines) else 1
    return max(0, int(engines))
