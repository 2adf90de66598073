"""One plan for every rank: rank 0 plans, and the others take its plan.

The planner is deterministic, but ranks can still differ in what they plan with: the
rates each found cached on its own host, a model built with another seed. Under an
initialised ``torch.distributed`` group of more than one rank, rank 0 plans and
broadcasts the plan as JSON (:meth:`CheckpointPlan.to_dict`); every other rank returns
the same plan, so that no rank holds more memory or takes longer than the others. If
rank 0 cannot plan, every rank raises its message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from ._plan import CheckpointPlan

__all__ = ["agreed"]


def _group_size() -> int:
    if not dist.is_available() or not dist.is_initialized():
        return 1
    return dist.get_world_size()


def agreed(make: Callable[[], CheckpointPlan]) -> CheckpointPlan:
    """``make()`` on rank 0, and its plan on every rank (``make()`` alone without a group)."""
    if _group_size() == 1:
        return make()
    payload: list[Any] = [None]
    failure: BaseException | None = None
    if dist.get_rank() == 0:
        try:
            payload[0] = {"plan": make().to_dict()}
        except Exception as error:  # the other ranks must hear of any failure
            failure = error
            payload[0] = {"error": f"{type(error).__name__}: {error}"}
    dist.broadcast_object_list(payload, src=0)
    if failure is not None:
        raise failure
    if "error" in payload[0]:
        raise ValueError(
            f"checkpointing: rank 0 could not plan, so no rank has a plan: {payload[0]['error']}"
        )
    return CheckpointPlan.from_dict(payload[0]["plan"])
