"""Shared output for benchmark scripts: a printed table and a JSON file in results/."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    """Describe the machine and software the figures were taken on."""
    import torch

    import accel
    from checkpointing.planner._tables import cpu_table, host_processor

    cpu = host_processor()
    facts: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        # What the host's CPU is, and the built-in CPU table the planner takes for it.
        "cpu": {**dataclasses.asdict(cpu), "built_in_table": cpu_table(cpu).processor},
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "accel": accel.__version__,
    }
    # The card, where the benchmark used one (asking would otherwise initialise CUDA).
    if torch.cuda.is_initialized():
        facts["gpu"] = torch.cuda.get_device_name()
    return facts


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Print rows under headers in aligned columns."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for index, row in enumerate(cells):
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
        if index == 0:
            print("  ".join("-" * width for width in widths))


def write_results(
    name: str, backend: str, payload: dict[str, Any], directory: Path | None = None
) -> Path:
    """Write ``payload`` plus machine facts and the date to results/<name>-<backend>-<date>.json.

    ``directory`` replaces ``benchmarks/results/`` (a test's temporary folder).
    """
    now = dt.datetime.now(dt.timezone.utc)
    document = {"benchmark": name, "backend": backend, "date": now.isoformat(), **payload}
    document["machine"] = machine()
    folder = RESULTS_DIR if directory is None else directory
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{backend}-{now:%Y%m%d}.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path


def checkout(revision: str, into: str) -> str:
    """Extract the packages of git ``revision`` into ``into`` (for ``PYTHONPATH``)."""
    packages = ("accel", "backends", "checkpointing")
    archive = subprocess.run(
        ["git", "-C", str(RESULTS_DIR.parents[1]), "archive", revision, *packages],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return into
