"""Cost of backend selection and of a protocol call.

Measures, on the selected backend:
* a cached ``get_backend()`` (target: under 1 us);
* the first ``get_backend()`` of a fresh process, discovery included, beyond
  ``import torch`` (target: under 50 ms), with the number of installed distributions;
* a no-op protocol call (``mark_step`` on an eager backend).

Usage: python benchmarks/bench_core.py [--backend NAME] [--repeats N]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import statistics
import subprocess
import sys
import timeit
from pathlib import Path

# The script's own folder is on sys.path when run as `python benchmarks/bench_core.py`.
from _report import print_table, write_results

import accel

CACHED_TARGET_NS = 1_000
FIRST_CALL_TARGET_MS = 50.0

FIRST_CALL_SCRIPT = """
import time, torch
start = time.perf_counter()
import accel
accel.get_backend({name!r})
print((time.perf_counter() - start) * 1000)
"""


def per_call_ns(statement: str, namespace: dict[str, object], number: int) -> float:
    """Return the best per-call time of ``statement`` over 5 runs, in nanoseconds."""
    runs = timeit.repeat(statement, globals=namespace, number=number, repeat=5)
    return min(runs) / number * 1e9


def first_call_ms(name: str | None, repeats: int) -> list[float]:
    """Time import accel + first get_backend() in fresh processes (torch already imported)."""
    script = FIRST_CALL_SCRIPT.format(name=name)
    return [
        float(
            subprocess.run(
                [sys.executable, "-c", script], check=True, capture_output=True, text=True
            ).stdout
        )
        for _ in range(repeats)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default=None, help="backend name (default: auto)")
    parser.add_argument("--repeats", type=int, default=7, help="fresh processes to time")
    args = parser.parse_args()

    backend = accel.get_backend(args.backend)
    namespace: dict[str, object] = {
        "get_backend": accel.get_backend,
        "backend": backend,
        "name": args.backend,
    }
    cached = per_call_ns("get_backend(name)", namespace, 200_000)
    noop = per_call_ns("backend.mark_step()", namespace, 200_000)
    first = first_call_ms(args.backend, args.repeats)
    first_median = statistics.median(first)
    distributions = len({d.metadata["Name"] for d in importlib.metadata.distributions()})

    rows = [
        (
            "cached get_backend()",
            f"{cached:.0f} ns",
            f"< {CACHED_TARGET_NS} ns",
            cached < CACHED_TARGET_NS,
        ),
        (
            "first get_backend() (import accel + discovery)",
            f"{first_median:.1f} ms",
            f"< {FIRST_CALL_TARGET_MS:.0f} ms",
            first_median < FIRST_CALL_TARGET_MS,
        ),
        (f"no-op protocol call ({backend.name}.mark_step)", f"{noop:.0f} ns", "-", "-"),
    ]
    print(f"backend: {backend.name}; installed distributions: {distributions}\n")
    print_table(("measure", "value", "target", "met"), rows)
    path = write_results(
        "core",
        backend.name,
        {
            "installed_distributions": distributions,
            "cached_get_backend_ns": cached,
            "first_get_backend_ms": {"median": first_median, "runs": first},
            "noop_protocol_call_ns": noop,
            "targets": {
                "cached_get_backend_ns": {
                    "target": CACHED_TARGET_NS,
                    "met": cached < CACHED_TARGET_NS,
                },
                "first_get_backend_ms": {
                    "target": FIRST_CALL_TARGET_MS,
                    "met": first_median < FIRST_CALL_TARGET_MS,
                },
            },
        },
    )
    print(f"\nwrote {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")


if __name__ == "__main__":
    main()
