"""What the per-family benchmarks share: their families, sizes and rounds, and the build.

``bench_backward.py`` and ``bench_pointwise.py`` each measure one thing per zoo family,
at one thread by default, leaving out the families too slow for a host CPU.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

import torch
from _zoo import FAMILIES, ZooModel, build, unusable

from accel import Accelerator

#: Left out by default: Mamba's slow path takes seconds a step on a host CPU.
SLOW = ("mamba",)


def add_family_arguments(parser: argparse.ArgumentParser, rounds: int, what: str) -> None:
    """``--model``, ``--size``, ``--rounds`` (default ``rounds``, of ``what``) and ``--threads``."""
    default = ",".join(f for f in FAMILIES if f not in SLOW)
    parser.add_argument("--model", default=default, help=f"families (default: {default})")
    parser.add_argument("--size", default="bench", choices=("small", "bench"))
    parser.add_argument("--rounds", type=int, default=rounds, help=f"{what} per family")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's)")


def built(args: argparse.Namespace, backend: Accelerator) -> Iterator[ZooModel]:
    """Each family of ``args.model`` built at ``args.size`` on the backend's device.

    Sets ``args.threads`` first; a family that cannot be built here is named on stderr
    with the reason and left out.
    """
    if args.threads:
        torch.set_num_threads(args.threads)
    for family in args.model.split(","):
        reason = unusable(family)
        if reason is not None:
            print(f"{family}: skipped ({reason})", file=sys.stderr)
            continue
        case = build(family, args.size)
        case.to(backend.device())
        yield case
