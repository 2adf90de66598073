"""Planning's own memory: what planning to a budget holds, against the step it avoids.

People plan to a memory budget because the plain step does not fit. This script
reproduces issue 29's measurement: an 8-block transformer stack
(``nn.TransformerEncoderLayer``, width 256, 4 heads, feed-forward 1024, dropout 0.1),
8 x 512 tokens, small parameters, one thread, one fresh process per case:

* ``plain step``: one training step of the model as built;
* ``every block checkpointed``: one step with each block checkpointed whole;
* ``planning at 0.5``: ``plan_checkpointing(model, (x,), memory_budget=0.5)`` alone;
* ``planned step``: one step of the model with that plan applied (what the plan needs);
* with ``--before REV``: ``planning at 0.5 (REV)``: the same planning with the
  ``accel``/``checkpointing`` packages of git revision REV (e.g. ``main``).

Each case reports its peak RSS above the built model (Linux: ``/proc/self/clear_refs``
resets the high-water mark after building; elsewhere the process's ``ru_maxrss`` less
the RSS after building) and, in a second fresh process, the peak of live tensors
(``LiveActivationMeter.peak_bytes``: storages created by operators, freed ones
subtracted; parameters excluded). Target (issue 29, item 6): planning's peak no higher
than the planned step's plus one block's activations, and below the plain step's.

Usage: python benchmarks/bench_planning_memory.py [--before REV] [--threads N] [--jobs N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

CASES = ("plain step", "every block checkpointed", "planning at 0.5", "planned step")
ROOT = Path(__file__).resolve().parents[1]


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


def _reset_peak() -> int:
    """Reset the RSS high-water mark where the kernel allows; the RSS now, in bytes."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return _rss_kib("VmRSS") * 1024
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _peak() -> int:
    try:
        return _rss_kib("VmHWM") * 1024
    except (OSError, KeyError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _trim() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def run_case(case: str, meter: bool, threads: int) -> dict[str, Any]:
    """One case in this process: its peak RSS (or live-tensor peak) above the built model."""
    import torch
    from torch import nn

    from checkpointing import apply_activation_checkpointing, plan_checkpointing

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = nn.Sequential(
        *(nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.1, batch_first=True) for _ in range(8))
    ).train()
    x = torch.randn(8, 512, 256, generator=torch.Generator().manual_seed(1))
    plan = None
    if case == "every block checkpointed":
        apply_activation_checkpointing(model)
    elif case == "planned step":
        plan = plan_checkpointing(model, (x,), 0.5)
        plan.apply(model)
        _trim()  # give planning's freed heap back, so that the step's peak is its own

    def work() -> None:
        if case.startswith("planning"):
            plan_checkpointing(model, (x,), 0.5)
        else:
            model(x).sum().backward()

    baseline = _reset_peak()
    if meter:
        with _meter()(exclude=[*model.parameters(), *model.buffers()]) as live:
            work()
        return {"live_peak_bytes": live.peak_bytes}
    work()
    return {"rss_peak_bytes": _peak() - baseline}


def _meter() -> Any:
    """This tree's ``LiveActivationMeter`` (with ``peak_bytes``), whichever tree plans."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "accel_bench_measure", ROOT / "checkpointing" / "_measure.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.LiveActivationMeter


def _fresh(case: str, meter: bool, threads: int, path: str | None) -> dict[str, Any]:
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([path, env.get("PYTHONPATH", "")])
    command = [sys.executable, __file__, "--case", case, "--threads", str(threads)]
    if meter:
        command.append("--meter")
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--before", metavar="REV", default=None, help="also plan with REV")
    parser.add_argument("--jobs", type=int, default=1, help="cases run at once (default 1)")
    parser.add_argument("--case", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--meter", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case is not None:
        print(json.dumps(run_case(args.case, args.meter, args.threads)))
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _report import checkout, print_table, write_results

    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        path = None if args.before is None else checkout(args.before, scratch)
        cases = [(case, None) for case in CASES]
        if path is not None:
            cases.append((f"planning at 0.5 ({args.before})", path))
        runs = [(label, where, meter) for label, where in cases for meter in (False, True)]

        def one(run: tuple[str, str | None, bool]) -> dict[str, Any]:
            label, where, meter = run
            case = "planning at 0.5" if label.startswith("planning") else label
            return _fresh(case, meter, args.threads, where)

        with ThreadPoolExecutor(args.jobs) as pool:
            for (label, _, _), found in zip(runs, pool.map(one, runs), strict=True):
                rows.setdefault(label, {}).update(found)
                print(f"{label}: {found}", file=sys.stderr)
    plain = rows["plain step"]
    table = [
        (
            label,
            f"{row['rss_peak_bytes'] / 2**20:,.0f} MiB",
            f"{row['rss_peak_bytes'] / plain['rss_peak_bytes']:.2f}x",
            f"{row['live_peak_bytes'] / 2**20:,.0f} MiB",
            f"{row['live_peak_bytes'] / plain['live_peak_bytes']:.2f}x",
        )
        for label, row in rows.items()
    ]
    print_table(("case", "peak RSS", "vs plain", "live-tensor peak", "vs plain"), table)
    import torch

    out = write_results(
        "planning-memory",
        "cpu",
        {
            "model": "8 x TransformerEncoderLayer(256, 4, 1024), 8 x 512 tokens",
            "threads": args.threads,
            "torch_version": torch.__version__,
            "cases": rows,
        },
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
