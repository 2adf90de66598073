"""The built-in CPU rates of the planner's cost model, measured: how each CPU table was made.

``checkpointing.calibrate_rates`` run on this host, with one intra-op thread: once per
zoo family at its benchmark size, with the family's model (so that every pointwise,
normalisation, reduction and copy operator its step calls is timed at its shapes),
after ``--plain`` runs without a model. Each general rate (products, attention,
convolutions, memory, random draws, the fixed cost of a call, the selective policy's
cost per call and per kept call, a saved-tensor hook's) is the median over every run;
each operator's byte rate is the median over the families that call it.

Prints the table as Python (to paste into ``checkpointing/planner/_tables.py``, as the
table of this host's processor: see ``CPU_TABLES``) and writes the runs to
``benchmarks/results/rates-cpu-DATE.json``, whose ``machine`` names the processor. Run
it on an otherwise idle host.

Usage: python benchmarks/bench_rates.py [--model a,b|all] [--plain 3]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from _allocator import add_option, settle
from _rates_runs import GENERAL, combine
from _report import write_results
from _zoo import FAMILIES, build, unusable


def main() -> int:
    """Calibrate, combine, print and record; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="all", help="zoo families, comma-separated")
    parser.add_argument("--plain", type=int, default=3, help="runs without a model")
    add_option(parser)
    args = parser.parse_args()
    allocator = settle(args.allocator)
    torch.set_num_threads(1)
    from checkpointing import calibrate_rates

    families = FAMILIES if args.model == "all" else tuple(args.model.split(","))
    runs: dict[str, dict[str, Any]] = {}
    started = time.perf_counter()
    for number in range(args.plain):
        runs[f"plain {number}"] = calibrate_rates("cpu").to_dict()
    for family in families:
        reason = unusable(family)
        if reason is not None:
            print(f"{family}: skipped, {reason}")
            continue
        case = build(family, "bench")
        try:
            rates = calibrate_rates("cpu", model=case.model, example_inputs=case.inputs)
        except RuntimeError as error:  # a model that cannot run on fake tensors
            print(f"{family}: no operator rates ({str(error).splitlines()[0]})")
            continue
        runs[family] = rates.to_dict()
        print(f"{family}: {len(rates.operator_bytes)} operators")
    general, operators = combine(runs)
    print("\n# proposed table for this host's processor (checkpointing/planner/_tables.py)")
    for name in GENERAL:
        print(f"    {name}={general[name]:.3g},")
    print("    operator_bytes={")
    for name, rate in operators.items():
        print(f'        "{name}": {rate:.3g},')
    print("    },")
    path = write_results(
        "rates",
        "cpu",
        {
            "threads": 1,
            "allocator": allocator,
            "seconds": time.perf_counter() - started,
            "general": general,
            "operator_bytes": operators,
            "runs": runs,
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
