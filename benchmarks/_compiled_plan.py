"""``bench_budget.py --compile``'s judge: does a plan hold under ``torch.compile``?

The flow users follow: plan and apply in eager mode, then ``torch.compile(model)``. For
each family the ``compiled, plan 0.5`` and ``compiled, plan 0.25`` variants are judged
against ``compiled`` (the plain model compiled) on three counts:

* memory: the compiled planned step's saved bytes (the graph walk, over the eager plain
  step's walk) at most the plan's compiled estimate plus ``MARGIN`` (2%) of the plain
  step's. The compiled estimate (``CheckpointPlan.compiled_estimated_bytes``) is the
  plan's estimate plus the generator state a compiled region keeps for each random draw
  it recomputes, which the plan's note states where it is above the estimate;
* graph breaks: the planned model's, counted by dynamo while its first step compiles,
  minus the plain model's: none added;
* exactness: the loss and every gradient bit-equal to the compiled plain model's, or
  within ``COMPILED_TOLERANCE`` (relative, as ``_budget_measure.difference`` measures it),
  since a compiler may fuse a recomputed region otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["COMPILED_TOLERANCE", "MARGIN", "PLAN", "VERDICTS", "counted_graph_breaks", "judge"]

MARGIN = 0.02
COMPILED_TOLERANCE = 1e-4
PLAN = "compiled, plan 0.5"
#: Every compiled plan judged, as (the JSON key of its verdict, its variant, its budget):
#: at 0.25 more module calls are checkpointed whole, some around calls planned one by
#: one (ALBERT's layer group around its activation).
VERDICTS = (
    ("compiled_plan", PLAN, 0.5),
    ("compiled_plan_quarter", "compiled, plan 0.25", 0.25),
)


def counted_graph_breaks(run: Callable[[], Any]) -> tuple[Any, int]:
    """What ``run()`` returns, and the graph breaks dynamo counted while it ran."""
    counters = torch._dynamo.utils.counters
    before = sum(counters["graph_break"].values())
    result = run()
    return result, sum(counters["graph_break"].values()) - before


def judge(rows: dict[str, dict[str, Any]], plan: str = PLAN) -> dict[str, Any] | None:
    """Compiled plan ``plan``'s verdict, from ``run_case``'s rows; ``None`` without both."""
    planned, plain = rows.get(plan), rows.get("compiled")
    if planned is None or plain is None:
        return None
    compiled_estimate = planned.get("estimated_compiled_bytes_ratio")
    estimate = planned["estimated_bytes_ratio"] if compiled_estimate is None else compiled_estimate
    within = planned["bytes_ratio"] <= estimate + MARGIN
    added = planned["graph_breaks"] - plain["graph_breaks"]
    exact = bool(planned["bit_equal"]) or planned["grad_difference"] <= COMPILED_TOLERANCE
    return {
        "bytes_ratio": planned["bytes_ratio"],
        "estimate": estimate,
        "eager_estimate": planned["estimated_bytes_ratio"],
        "limit": estimate + MARGIN,
        "within_estimate": within,
        "compiled_plain_bytes_ratio": plain["bytes_ratio"],
        "graph_breaks_plain": plain["graph_breaks"],
        "graph_breaks_plan": planned["graph_breaks"],
        "graph_breaks_added": added,
        "bit_equal": planned["bit_equal"],
        "grad_difference": planned["grad_difference"],
        "exact": exact,
        "met": within and added <= 0 and exact,
    }
