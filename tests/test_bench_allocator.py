"""The benchmarks' allocator setting: held, a step's freed blocks are reused, not faulted in.

Each case runs in a child process, since ``mallopt`` changes the whole process. The child
allocates and frees, six times over, the blocks of a made-up step (2 to 40 MiB, 112 MiB
in all). As glibc comes, a block above its largest dynamic mmap threshold (32 MiB) is
mapped afresh every time, and others are given back when the heap's free top grows past
twice the threshold, so every repeat faults pages in again. Held, the repeats reuse the
first one's memory.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES_OF_LARGEST = 40 * 1024 * 1024 // 4096

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the setting is glibc's (Linux)"
)

_CHILD = """
import json, sys
sys.path.insert(0, {benchmarks!r})
import torch
from _allocator import minor_faults, settle
done = settle({choice!r})
faults = []
for _ in range(6):
    before = minor_faults()
    blocks = [torch.ones(mib * 256 * 1024) for mib in (4, 12, 8, 24, 2, 16, 6, 40)]
    del blocks
    faults.append(minor_faults() - before)
print(json.dumps({{"done": done, "faults": faults}}))
"""


def _run(choice: str) -> tuple[dict[str, object], list[int]]:
    code = _CHILD.format(benchmarks=str(REPO / "benchmarks"), choice=choice)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return result["done"], result["faults"]


def test_held_memory_is_reused_where_glibc_faults_it_in_again() -> None:
    done, held = _run("held")
    if not done["held"]:
        pytest.skip(f"not glibc here: {done['reason']}")
    assert done["mmap_threshold"] == 1 << 30
    default_done, default = _run("default")
    assert default_done == {
        "held": False,
        "reason": "--allocator default: glibc's own thresholds",
    }
    # As glibc comes, the 40 MiB block is mapped afresh and faulted in on every repeat.
    assert min(default[1:]) >= PAGES_OF_LARGEST
    # Held, the repeats take fewer faults, and at least one of them reuses the largest
    # block (how many do depends on the torch release's allocations: on torch 2.4.1 the
    # later repeats faulted it in again in one CI run, 39,424 faults in all).
    assert sum(held[1:]) < sum(default[1:])
    assert min(held[1:]) < PAGES_OF_LARGEST
