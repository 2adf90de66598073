"""The backward the planner estimates, against what the device measures, per zoo family.

Whole recomputation costs a step the forward's share of it, so a plan's estimate is
only as good as the cost model's split of the step into forward and backward. The
planner prices the backward it records on fake tensors; where a model cannot run on
fake tensors (an ``nn.LSTM``; every model on torch 2.4) no backward is recorded and it
is estimated from the forward, call by call (``_pricing.backward_seconds``). This
script puts, for each family:

* ``estimated``: the priced forward, the recorded backward (where there is one), the
  call-by-call estimate and twice the forward (the rule before 2026-11-29), each
  backward as a ratio to the priced forward;
* ``measured``: the device's forward (with autograd recording, as in training) and
  backward, medians over ``--rounds`` interleaved steps, and their ratio.

Usage: python benchmarks/bench_backward.py [--model lstm,gpt2] [--rounds 20] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import torch
from _per_family import add_family_arguments, built
from _report import print_table, write_results
from _zoo import ZooModel

from accel import Accelerator, get_backend
from checkpointing.planner import builtin_rates, profile_step
from checkpointing.planner._pricing import backward_seconds, op_seconds


def estimated(case: ZooModel, backend: Accelerator) -> dict[str, Any]:
    """The priced forward and the three backwards (seconds), and each backward over it."""
    recorded = profile_step(case.model, case.inputs, backend=backend)
    rates = builtin_rates(backend.device_type)
    forward = [(work, op_seconds(work, rates)) for work in recorded.forward]
    seconds = sum(price for _, price in forward)
    figures = {
        "forward_seconds": seconds,
        "fallback": bool(recorded.fallback),
        "recorded": sum(op_seconds(work, rates) for work in recorded.backward) or None,
        "call_by_call": sum(backward_seconds(work, price) for work, price in forward),
        "twice_the_forward": 2.0 * seconds,
    }
    for name in ("recorded", "call_by_call", "twice_the_forward"):
        value = figures[name]
        figures[f"{name}_ratio"] = None if value is None else value / seconds
    return figures


def measured(case: ZooModel, backend: Accelerator, rounds: int) -> dict[str, Any]:
    """The device's forward and backward seconds (medians) and their ratio."""
    forwards, backwards = [], []
    for index in range(rounds + 2):  # two warm-up steps
        backend.synchronize()
        started = time.perf_counter()
        loss = case.loss(case.model)
        backend.synchronize()
        middle = time.perf_counter()
        loss.backward()
        backend.synchronize()
        ended = time.perf_counter()
        case.model.zero_grad(set_to_none=True)
        if index >= 2:
            forwards.append(middle - started)
            backwards.append(ended - middle)
    forward, backward = statistics.median(forwards), statistics.median(backwards)
    return {"forward_seconds": forward, "backward_seconds": backward, "ratio": backward / forward}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_family_arguments(parser, rounds=20, what="timed steps")
    args = parser.parse_args()
    backend = get_backend()
    rows: dict[str, dict[str, Any]] = {}
    for case in built(args, backend):
        family = case.family
        rows[family] = {
            "estimated": estimated(case, backend),
            "measured": measured(case, backend, args.rounds),
        }
        print(f"{family}: {rows[family]}", file=sys.stderr)

    def ratio(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    print_table(
        ("model", "measured B/F", "recorded", "call by call", "twice the forward"),
        [
            (
                family,
                ratio(row["measured"]["ratio"]),
                ratio(row["estimated"]["recorded_ratio"]),
                ratio(row["estimated"]["call_by_call_ratio"]),
                ratio(row["estimated"]["twice_the_forward_ratio"]),
            )
            for family, row in rows.items()
        ],
    )
    out = write_results(
        "backward",
        backend.device_type,
        {
            "size": args.size,
            "rounds": args.rounds,
            "threads": args.threads,
            "torch_version": torch.__version__,
            "models": rows,
        },
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
