"""The byte-priced calls of a step, priced against what ``torch.profiler`` measures.

The cost model prices pointwise, normalisation, reduction and copy calls by their bytes
(``DeviceRates.memory_bytes`` and ``operator_bytes``). Those rates are only as good as
the conditions they were timed in: repeated on the same tensors, a call finds them in
the caches; in a step, other calls moved as many bytes since its inputs were written.
This script puts, for each zoo family:

* ``priced``: the seconds the built-in table gives the byte-priced calls of the step
  the planner records (forward and backward; the forward alone where no backward is
  recorded), and the same under each ``--rates`` file's table (``bench_rates.py``
  results, combined as the built-in table is);
* ``measured``: the self time ``torch.profiler`` gives the same operators in the real
  step (the same passes), averaged over ``--rounds`` steps after two warm-up steps;
* each table's ``measured / priced``, and its median and range over the families.

A profiler adds a little to each call, so the measured side is a touch high; the
comparison is of tables against each other, on the same measured steps.

Usage: python benchmarks/bench_pointwise.py [--model gpt2,bert] [--rounds 3]
    [--rates warm=benchmarks/results/rates-cpu-machinery-20261128.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
from _per_family import add_family_arguments, built
from _rates_runs import combine
from _report import print_table, write_results
from _zoo import ZooModel
from torch import profiler

from accel import Accelerator, get_backend
from checkpointing import DeviceRates
from checkpointing.planner import builtin_rates, profile_step
from checkpointing.planner._pricing import by_bytes, op_seconds


def table(path: str, backend: Accelerator) -> DeviceRates:
    """The rates of a ``bench_rates.py`` results file, combined as the built-in table is."""
    built_in = builtin_rates(backend.device_type)
    general, operators = combine(json.loads(Path(path).read_text())["runs"], built_in)
    values = {**built_in.to_dict(), **general, "operator_bytes": operators}
    return DeviceRates.from_dict({**values, "source": f"bench_rates.py: {path}"})


def priced(
    case: ZooModel, backend: Accelerator, tables: dict[str, DeviceRates]
) -> tuple[dict[str, float], set[str], bool]:
    """Each table's seconds for the step's byte-priced calls, their operators, and
    whether only the forward was recorded."""
    recorded = profile_step(case.model, case.inputs, backend=backend)
    calls = [w for w in (*recorded.forward, *recorded.backward) if by_bytes(w)]
    seconds = {name: sum(op_seconds(w, rates) for w in calls) for name, rates in tables.items()}
    operators = {w.name for w in calls}
    return seconds, operators, bool(recorded.fallback)


def measured(
    case: ZooModel, backend: Accelerator, operators: set[str], forward_only: bool, rounds: int
) -> float:
    """The profiler's self seconds of ``operators`` in one real step (mean of ``rounds``)."""
    total = 0.0
    for index in range(rounds + 2):  # two warm-up steps
        with profiler.profile(activities=[profiler.ProfilerActivity.CPU]) as prof:
            loss = case.loss(case.model)
            if not forward_only:
                loss.backward()
            backend.synchronize()
        if forward_only:
            loss.backward()
        case.model.zero_grad(set_to_none=True)
        if index < 2:
            continue
        for event in prof.key_averages():
            name = event.key.removeprefix("aten::")
            if event.key.startswith("aten::") and name in operators:
                total += event.self_cpu_time_total / 1e6
    return total / rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_family_arguments(parser, rounds=3, what="profiled steps")
    parser.add_argument(
        "--rates",
        action="append",
        default=[],
        metavar="NAME=RATES.json",
        help="also price with the table of this bench_rates.py results file",
    )
    args = parser.parse_args()
    backend = get_backend()
    tables = {"built-in": builtin_rates(backend.device_type)}
    for given in args.rates:
        name, _, path = given.partition("=")
        tables[name] = table(path, backend)
    rows: dict[str, dict[str, Any]] = {}
    for case in built(args, backend):
        family = case.family
        seconds, operators, forward_only = priced(case, backend, tables)
        real = measured(case, backend, operators, forward_only, args.rounds)
        rows[family] = {
            "forward_only": forward_only,
            "operators": sorted(operators),
            "measured_seconds": real,
            "priced_seconds": seconds,
            "measured_over_priced": {name: real / s for name, s in seconds.items() if s > 0},
        }
        print(f"{family}: {rows[family]['measured_over_priced']}", file=sys.stderr)
    summary = {}
    for name in tables:
        ratios = [row["measured_over_priced"][name] for row in rows.values()]
        summary[name] = {
            "median": statistics.median(ratios),
            "low": min(ratios),
            "high": max(ratios),
            "source": tables[name].source,
        }
    print_table(
        ("model", "measured ms", *(f"{name}: ms, meas/priced" for name in tables)),
        [
            (
                family,
                f"{row['measured_seconds'] * 1e3:.1f}",
                *(
                    f"{row['priced_seconds'][n] * 1e3:.1f}, {row['measured_over_priced'][n]:.2f}"
                    for n in tables
                ),
            )
            for family, row in rows.items()
        ],
    )
    for name, figures in summary.items():
        print(
            f"{name}: measured / priced median {figures['median']:.2f} "
            f"({figures['low']:.2f} to {figures['high']:.2f})"
        )
    out = write_results(
        "pointwise",
        backend.device_type,
        {
            "size": args.size,
            "rounds": args.rounds,
            "threads": args.threads,
            "torch_version": torch.__version__,
            "summary": summary,
            "models": rows,
        },
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
