"""The host's allocator held steady while a benchmark times steps on the CPU.

glibc's ``malloc`` serves a large block with ``mmap`` and unmaps it when it is freed; it
then raises its threshold to that block's size, and gives the top of its heap back to
the kernel once more than twice the threshold lies free there. Which blocks go which way
depends on the order of earlier frees, so a training step's activations are faulted in
again on some steps and not others. On this workplace's two-core Xeon (torch 2.13.0, one
thread, quiet, 2026-11-29) GPT-2's and ViT's plain steps took 1,600 to 3,600 minor page
faults each, and from 0 to 11,000 from one GPT-2 step to the next; held, 0 to 110. ViT's
step took 394 to 456 ms with them and 295 to 390 ms without. They are not what makes
identical copies of one model, timed in the same rounds, differ: by 0.09 to 0.15 of a
step with glibc's thresholds and 0.05 to 0.17 held, in two runs of six copies each of
a few rounds. That was the rounds' noise: six copies of ConvNeXt, timed in 120 rounds,
agree within 0.007 (``_budget_checks.median_interval``).

:func:`hold_freed_memory` fixes both thresholds (``mallopt``) so that freed memory stays
in the process and is reused: what PyTorch's CPU performance guide gets by preloading
jemalloc or TCMalloc, and what ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_``
give a training job. :func:`minor_faults` counts faults, for a benchmark's JSON.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import resource
from typing import Any

__all__ = [
    "MMAP_THRESHOLD",
    "TRIM_THRESHOLD",
    "add_option",
    "hold_freed_memory",
    "minor_faults",
    "settle",
]

#: Blocks below 1 GiB come from the heap, not from a mapping of their own.
MMAP_THRESHOLD = 1 << 30
#: The heap's free top is given back to the kernel past 2 GiB (``mallopt`` takes an int).
TRIM_THRESHOLD = 2**31 - 1
# glibc's <malloc.h> parameter numbers.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def hold_freed_memory() -> dict[str, Any]:
    """Set glibc's thresholds so that freed blocks are kept and reused, where glibc runs.

    Returns:
        What was done, for the results file: ``held`` (bool), the two thresholds set, or
        the ``reason`` nothing was (another C library, or ``mallopt`` refused a value).
    """
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
        version = libc.gnu_get_libc_version
    except (OSError, AttributeError, TypeError):
        return {"held": False, "reason": f"the C library ({name}) is not glibc"}
    version.restype = ctypes.c_char_p
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    for parameter, value in (
        (_M_MMAP_THRESHOLD, MMAP_THRESHOLD),
        (_M_TRIM_THRESHOLD, TRIM_THRESHOLD),
    ):
        if mallopt(parameter, value) != 1:
            return {"held": False, "reason": f"mallopt({parameter}, {value}) was refused"}
    return {
        "held": True,
        "allocator": f"glibc {version().decode()}",
        "mmap_threshold": MMAP_THRESHOLD,
        "trim_threshold": TRIM_THRESHOLD,
    }


def minor_faults() -> int:
    """The minor page faults this process has taken so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def add_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--allocator held|default`` to a benchmark's command line."""
    parser.add_argument(
        "--allocator",
        choices=("held", "default"),
        default="held",
        help="held (default): glibc keeps freed memory for reuse, so steps take no page "
        "faults that vary between them; default: glibc's own thresholds",
    )


def settle(choice: str) -> dict[str, Any]:
    """Apply ``--allocator``'s choice; what was done, for the results file."""
    if choice == "held":
        return hold_freed_memory()
    return {"held": False, "reason": "--allocator default: glibc's own thresholds"}
