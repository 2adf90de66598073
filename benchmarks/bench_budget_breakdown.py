"""Where a budget plan's extra step time goes: its saved-tensor rows against the rest.

Plans a zoo family (bench size) at one budget, then times, interleaved round by round
on the same inputs, the plain model and the plan split into parts:

* ``plan``: the plan as made;
* ``saved rows only``: only its saved-tensor-grain modules (drops and packs);
* ``saved rows, hooks only``: those modules' saved-tensor hooks with no position
  planned (every saved tensor kept: what the hooks alone cost);
* ``saved rows, packs only``: only the packed dropout masks, nothing dropped;
* ``other rows only``: the whole-module and selective rows without the saved ones.

Each variant's extra time is the median over the rounds of its step less the plain
step of the same round, set against the plan's own estimate for those rows, which is
how far the planner's estimate is from what the step pays, and for which grain.

``--per-call`` instead times each saved-grain call of the plan alone, on the arguments
it gets in the step (:mod:`_saved_calls`): the plain call, bare hooks, the grain's
wrapper with nothing planned, and the call's plan, beside its estimate.

``--by-decision`` instead times the plan with only the rows of one decision applied
(``checkpoint``, ``recompute cheap ops``, ``recompute saved``...), for each decision
the plan takes, beside those rows' estimate, and the plain step beside its estimate:
which grain's recomputation the cost model prices off, and against how far off it
prices the plain step.

Usage: python benchmarks/bench_budget_breakdown.py --model bert,whisper [--rounds 9]
[--per-call | --by-decision]
"""

from __future__ import annotations

import argparse
import copy
import statistics
from dataclasses import replace
from typing import Any

import _zoo
import torch
from _allocator import add_option, settle
from _budget_measure import timed_plans
from _report import print_table, write_results
from _saved_calls import per_call

import accel
from checkpointing import CheckpointPlan, plan_checkpointing

SAVED = "recompute saved"
PACK = "pack"


def _only(plan: CheckpointPlan, saved: bool) -> CheckpointPlan:
    """The plan with only its saved-grain rows (``saved``) or only the others."""
    return replace(
        plan,
        choices={n: d for n, d in plan.choices.items() if (d.grain == SAVED) == saved},
    )


def _positions(plan: CheckpointPlan, actions: tuple[str, ...]) -> CheckpointPlan:
    """The saved-grain plans with only the positions whose action is in ``actions``."""
    return replace(
        plan,
        choices={
            name: d
            if d.grain != SAVED
            else replace(
                d,
                payload=replace(
                    d.payload,
                    positions={k: v for k, v in d.payload.positions.items() if v[0] in actions},
                ),
            )
            for name, d in plan.choices.items()
        },
    )


def _extra_seconds(
    case: _zoo.ZooModel, variants: dict[str, CheckpointPlan | None], rounds: int
) -> tuple[float, dict[str, float]]:
    """The plain step's median seconds, and each variant's median extra over it.

    ``variants`` holds ``"plain": None`` and the plans to apply, each to its own copy of
    the model; the rounds are interleaved, and each extra is taken within a round.
    """
    times = timed_plans(case, variants, accel.get_backend(), rounds)
    extra = {
        label: statistics.median(a - b for a, b in zip(v, times["plain"], strict=True))
        for label, v in times.items()
    }
    return statistics.median(times["plain"]), extra


def by_decision(plan: CheckpointPlan) -> dict[str, tuple[CheckpointPlan, float]]:
    """Each decision of ``plan`` but keep: the plan with only its rows, and their
    estimated recompute seconds (the grain's own cost per call and per saved tensor
    included)."""
    decisions = sorted({row.decision for row in plan.rows} - {"keep"})
    return {
        decision: (
            replace(plan, choices={n: d for n, d in plan.choices.items() if d.grain == decision}),
            sum(r.recompute_seconds for r in plan.rows if r.decision == decision),
        )
        for decision in decisions
    }


def decision_breakdown(family: str, budget: float, rounds: int) -> dict[str, Any]:
    """Time each decision's rows of the plan alone against the plain step."""
    case = _zoo.build(family, "bench")
    plan = plan_checkpointing(copy.deepcopy(case.model), case.inputs, budget)
    parts = by_decision(plan)
    variants: dict[str, CheckpointPlan | None] = {"plain": None, "plan": plan}
    variants.update({decision: part for decision, (part, _) in parts.items()})
    plain, extra = _extra_seconds(case, variants, rounds)
    estimated = {decision: seconds for decision, (_, seconds) in parts.items()}
    estimated["plan"] = sum(estimated.values())
    return {
        "family": family,
        "budget": budget,
        "plain_step_seconds": plain,
        "estimated_plain_step_seconds": plan.step_seconds,
        "estimated_step_time_ratio": plan.estimated_step_time_ratio,
        "estimated_recompute_seconds": estimated,
        "extra_seconds": extra,
        "plan": str(plan),
    }


def breakdown(family: str, budget: float, rounds: int) -> dict[str, Any]:
    """Time the plan's parts against the plain step (see the module docstring)."""
    case = _zoo.build(family, "bench")
    plan = plan_checkpointing(copy.deepcopy(case.model), case.inputs, budget)
    saved = _only(plan, saved=True)
    variants: dict[str, CheckpointPlan | None] = {
        "plain": None,
        "plan": plan,
        "saved rows only": saved,
        "saved rows, hooks only": _positions(saved, ()),
        "saved rows, packs only": _positions(saved, (PACK,)),
        "other rows only": _only(plan, saved=False),
    }
    plain, extra = _extra_seconds(case, variants, rounds)
    estimated = {
        "saved rows": sum(r.recompute_seconds for r in plan.rows if r.decision == SAVED),
        "other rows": sum(
            r.recompute_seconds for r in plan.rows if r.decision not in (SAVED, "keep")
        ),
    }
    return {
        "family": family,
        "budget": budget,
        "plain_step_seconds": plain,
        "estimated_step_time_ratio": plan.estimated_step_time_ratio,
        "estimated_recompute_seconds": estimated,
        "extra_seconds": extra,
        "plan": str(plan),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert,whisper", help="zoo families")
    parser.add_argument("--budget", type=float, default=0.5, help="memory budget (0.5)")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved timed rounds")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--per-call",
        action="store_true",
        help="time each saved-grain call alone instead (bare hooks, wrapper, plan)",
    )
    mode.add_argument(
        "--by-decision",
        action="store_true",
        help="time each decision's rows alone instead (checkpoint, selective, saved...)",
    )
    add_option(parser)
    args = parser.parse_args()
    allocator = settle(args.allocator)
    torch.set_num_threads(args.threads)
    if args.per_call:
        _per_call(args, allocator)
        return
    if args.by_decision:
        _by_decision(args, allocator)
        return
    found = [breakdown(f, args.budget, args.rounds) for f in args.model.split(",")]
    rows = []
    for result in found:
        estimate = result["estimated_recompute_seconds"]
        for label, extra in result["extra_seconds"].items():
            if label == "plain":
                continue
            guess = {"saved rows only": estimate["saved rows"]}.get(label)
            guess = estimate["other rows"] if label == "other rows only" else guess
            rows.append(
                (
                    result["family"],
                    label,
                    f"{extra * 1e3:.1f} ms",
                    "" if guess is None else f"{guess * 1e3:.1f} ms",
                    f"{1 + extra / result['plain_step_seconds']:.2f}x",
                )
            )
    print_table(("model", "variant", "extra step time", "estimated", "step ratio"), rows)
    _write("budget-breakdown", args, allocator, found)


def _by_decision(args: argparse.Namespace, allocator: dict[str, Any]) -> None:
    found = [decision_breakdown(f, args.budget, args.rounds) for f in args.model.split(",")]
    rows = []
    for result in found:
        plain = result["plain_step_seconds"]
        plain_estimate = result["estimated_plain_step_seconds"]
        rows.append(
            (
                result["family"],
                "plain (whole step)",
                f"{plain * 1e3:.1f} ms",
                f"{plain_estimate * 1e3:.1f} ms",
                f"{plain / plain_estimate:.2f}",
            )
        )
        for label, seconds in result["estimated_recompute_seconds"].items():
            extra = result["extra_seconds"][label]
            rows.append(
                (
                    result["family"],
                    label,
                    f"{extra * 1e3:.2f} ms",
                    f"{seconds * 1e3:.2f} ms",
                    f"{extra / seconds:.2f}" if seconds > 0 else "",
                )
            )
    print_table(("model", "rows", "measured", "estimated", "measured / estimated"), rows)
    _write("budget-breakdown-decisions", args, allocator, found)


def _per_call(args: argparse.Namespace, allocator: dict[str, Any]) -> None:
    found = [per_call(f, args.budget, args.rounds) for f in args.model.split(",")]
    rows = []
    for result in found:
        for call in result["calls"]:
            extra = call["extra_seconds"]
            rows.append(
                (
                    result["family"],
                    call["module"],
                    f"{call['plain_seconds'] * 1e3:.2f} ms",
                    *(f"{extra[label] * 1e3:.2f} ms" for label in extra),
                    f"{call['estimated_seconds'] * 1e3:.2f} ms",
                )
            )
    print_table(
        ("model", "call", "plain", "bare hooks", "wrapper, nothing", "plan", "estimated"),
        rows,
    )
    _write("budget-breakdown-calls", args, allocator, found)


def _write(
    name: str, args: argparse.Namespace, allocator: dict[str, Any], found: list[dict[str, Any]]
) -> None:
    out = write_results(
        name,
        accel.get_backend().name,
        {
            "rounds": args.rounds,
            "threads": args.threads,
            "allocator": allocator,
            "torch_version": torch.__version__,
            "models": found,
        },
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
