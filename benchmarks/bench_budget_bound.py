"""How close a plan's estimate is to what recomputation alone could cost, per zoo family.

A plan's estimated step is the plain step, the operators it runs again, and its grains'
machinery (a checkpoint's hooks and frames, the saved-tensor grain's hooks and replays,
a selective policy per call). For each family and budget this script sets three
estimates beside the time target at 0.5 (1.15x for the transformer-shaped families,
1.20x for the others):

* ``planned``: the planner's plan (``estimated_step_time_ratio``);
* ``no_margins``: the plan the search makes with every grain's margin at 0, so that it
  takes whichever option the cost model prices lowest: the fastest plan its options
  can make, by its own prices;
* ``operators_alone``: a bound under any recomputing plan, by the same prices: each
  saved storage dropped costs the forward calls that write it, once, and nothing else
  (no machinery, no recomputed input), cheapest per byte first, the last one in part,
  until the plain step's saved bytes are down to the budget (a fractional knapsack,
  whose optimum no plan can beat). Saved storages nothing in the forward writes (the
  model's inputs) cannot be dropped.

Between ``operators_alone`` and ``no_margins`` lies what the grains' machinery and
their coarser choices cost; where ``operators_alone`` is within a target and
``no_margins`` is not, the target is out of reach of today's grains, not of the
operators. The figures are the cost model's at the built-in rates of this host
(``builtin_rates``), the same in every run.

With ``--rounds N`` the plan and the plan without margins are also timed at 0.5,
interleaved with the plain step for ``N`` rounds (``measured``: the median of each
round's ratio to the plain step's): whether the margins, which keep the search off the
options the cost model prices least well, cost the step time their estimates say.

Usage: python benchmarks/bench_budget_bound.py [--model gpt2,t5] [--size bench|small]
       [--rounds N] [--threads N]
Writes ``benchmarks/results/budget-bound-<device>-<date>.json`` (``budget-bound-timed-...``
with ``--rounds``).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
from collections.abc import Iterator
from typing import Any

import torch
from _budget_checks import TARGET_TIME, TARGET_TRANSFORMER
from _budget_measure import timed_plans
from _per_family import add_family_arguments, built
from _report import print_table, write_results
from _zoo import TRANSFORMERS, ZooModel

from accel import Accelerator, get_backend
from checkpointing import CheckpointPlan, plan_checkpointing
from checkpointing.planner import StepProfile, builtin_rates, cost, profile_step
from checkpointing.planner._grains._registry import GRAINS

BUDGETS = (0.5, 0.25)
_ESTIMATES = ("planned", "no_margins", "operators_alone")


@contextlib.contextmanager
def no_margins() -> Iterator[None]:
    """Every grain's margin at 0 inside the block (the search weighs estimates alone)."""
    kept = [(type(grain), grain.margin) for grain in GRAINS]
    try:
        for kind, _ in kept:
            kind.margin = 0.0
        yield
    finally:
        for kind, margin in kept:
            kind.margin = margin


def operators_alone(profile: StepProfile, budget: float) -> float:
    """The step ratio no recomputing plan beats at ``budget`` (module docstring)."""
    price: dict[int, float] = {}
    for call in profile.modules[""].ops:
        for storage in {*call.fresh, *call.mutated}:
            price[storage] = price.get(storage, 0.0) + call.seconds
    need = (1.0 - budget) * profile.plain_bytes
    droppable = sorted(
        (price[storage] / size, size, price[storage])
        for storage in profile.saved_by
        if storage in price and (size := profile.storage_bytes[storage]) > 0
    )
    seconds = 0.0
    for _, size, cost_of in droppable:
        if need <= 0:
            break
        part = min(1.0, need / size)
        seconds += part * cost_of
        need -= part * size
    if need > 0:
        return float("inf")  # the inputs alone hold more than the budget
    return 1.0 + seconds / profile.step_time


def family_bounds(case: ZooModel, backend: Accelerator, rounds: int = 0) -> dict[str, Any]:
    """The three estimates at each budget, the time target at 0.5, and with ``rounds``
    the two plans at 0.5 timed."""
    recorded = profile_step(copy.deepcopy(case.model), case.inputs)
    profile = cost(recorded, builtin_rates(backend.device_type))
    rows: dict[str, Any] = {}
    plans: dict[str, CheckpointPlan] = {}
    for budget in BUDGETS:
        plans["planned"] = plan_checkpointing(case.model, case.inputs, budget, profile=recorded)
        with no_margins():
            plans["no_margins"] = plan_checkpointing(
                case.model, case.inputs, budget, profile=recorded
            )
        rows[str(budget)] = {
            **{name: plan.estimated_step_time_ratio for name, plan in plans.items()},
            "operators_alone": operators_alone(profile, budget),
        }
        if rounds and budget == 0.5:
            rows[str(budget)]["measured"] = _timed(case, backend, plans, rounds)
    target = TARGET_TRANSFORMER if case.family in TRANSFORMERS else TARGET_TIME
    return {"time_target": target, "budgets": rows}


def _timed(
    case: ZooModel, backend: Accelerator, plans: dict[str, CheckpointPlan], rounds: int
) -> dict[str, float]:
    """Each plan's step over the plain step's: the median of ``rounds`` interleaved rounds."""
    times = timed_plans(case, {"plain": None, **plans}, backend, rounds)
    return {
        name: statistics.median(t / p for t, p in zip(times[name], times["plain"], strict=True))
        for name in plans
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_family_arguments(parser, rounds=0, what="timed rounds of the plans at 0.5 (0: none)")
    args = parser.parse_args()
    backend = get_backend()
    models: dict[str, Any] = {}
    for case in built(args, backend):
        models[case.family] = family_bounds(case, backend, args.rounds)
        print(f"{case.family}: {models[case.family]['budgets']['0.5']}", flush=True)
    print_table(
        ("model", "target at 0.5", *(f"{b}: planned / no margins / operators" for b in BUDGETS)),
        [
            (
                family,
                f"{row['time_target']:.2f}x",
                *(
                    " / ".join(f"{row['budgets'][str(b)][k]:.3f}x" for k in _ESTIMATES)
                    for b in BUDGETS
                ),
            )
            for family, row in models.items()
        ],
    )
    out = write_results(
        "budget-bound-timed" if args.rounds else "budget-bound",
        backend.device_type,
        {
            "size": args.size,
            "budgets": list(BUDGETS),
            "rounds": args.rounds,
            "threads": torch.get_num_threads(),
            "torch_version": torch.__version__,
            "models": models,
        },
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
