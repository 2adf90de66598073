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

Usage: python benchmarks/bench_budget_breakdown.py --model bert,whisper [--rounds 9]
[--per-call]
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
from _budget_measure import interleaved, step
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


def breakdown(family: str, budget: float, rounds: int) -> dict[str, Any]:
    """Time the plan's parts against the plain step (see the module docstring)."""
    backend = accel.get_backend()
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
    models = {}
    for label, variant in variants.items():
        model = copy.deepcopy(case.model)
        if variant is not None:
            variant.apply(model)
        step(case, model, backend)  # warm-up
        models[label] = model
    times = interleaved(lambda label: step(case, models[label], backend), list(models), rounds)
    estimated = {
        "saved rows": sum(r.recompute_seconds for r in plan.rows if r.decision == SAVED),
        "other rows": sum(
            r.recompute_seconds for r in plan.rows if r.decision not in (SAVED, "keep")
        ),
    }
    return {
        "family": family,
        "budget": budget,
        "plain_step_seconds": statistics.median(times["plain"]),
        "estimated_step_time_ratio": plan.estimated_step_time_ratio,
        "estimated_recompute_seconds": estimated,
        "extra_seconds": {
            label: statistics.median(a - b for a, b in zip(v, times["plain"], strict=True))
            for label, v in times.items()
        },
        "plan": str(plan),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert,whisper", help="zoo families")
    parser.add_argument("--budget", type=float, default=0.5, help="memory budget (0.5)")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved timed rounds")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1)")
    parser.add_argument(
        "--per-call",
        action="store_true",
        help="time each saved-grain call alone instead (bare hooks, wrapper, plan)",
    )
    add_option(parser)
    args = parser.parse_args()
    allocator = settle(args.allocator)
    torch.set_num_threads(args.threads)
    if args.per_call:
        _per_call(args, allocator)
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
