"""``python -m accel``: show every backend, and which one ``get_backend()`` would pick.

Expected errors (an :class:`accel.AccelError`: a bad ``ACCEL`` for ``demo``, a broken
plugin under ``ACCEL_STRICT_PLUGINS=1``, a bad flag value) print one sentence on stderr
and exit with status 1; ``--json`` then prints ``{"error": ...}`` instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import warnings
from collections.abc import Sequence
from typing import Any, TextIO

from ._demo import add_arguments as add_demo_arguments
from ._demo import config_from as demo_config_from
from ._demo import run_demo
from ._discovery import accel_version
from ._errors import AccelError, BackendFallbackWarning
from ._select import BackendInfo, get_backend, list_backends, plugin_failures, select_backend

__all__ = ["main"]

_REASON_TEXT = {
    "explicit": "named explicitly",
    "ACCEL": "from the ACCEL environment variable",
    "auto": "auto-detected: the highest-priority available accelerator",
    "fallback": "fallback: no accelerator was found",
}
_COLUMNS = ("backend", "provider", "version", "status", "devices", "priority")
_PROG = "python -m accel"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description="List accel backends and show which one get_backend() would pick.",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--version",
        action=_VersionAction,
        help="print accel's, torch's and Python's versions and exit",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    conformance = commands.add_parser(
        "conformance",
        help="run the conformance suite against one backend",
        description="Run accel's conformance suite (pytest) against one backend; extra "
        "arguments go to pytest.",
    )
    conformance.add_argument("backend", help="backend name, as in ACCEL=<name>")
    demo = commands.add_parser(
        "demo",
        help="train a small GPT plain, checkpointed and offloaded, and compare",
        description="Train a small GPT four ways on the selected backend (plain, with "
        "accel's activation checkpointing, with offload, checkpointed to half the plain "
        "activation memory) and compare step time, memory, final loss and gradients.",
    )
    add_demo_arguments(demo)
    args, extra = parser.parse_known_args(argv)
    try:
        return _dispatch(args, extra, parser, demo)
    except AccelError as exc:
        if args.command is None and args.json:
            _write_json({"error": str(exc)}, sys.stdout)
        else:
            sys.stderr.write(f"{_PROG}: error: {exc}\n")
        return 1


class _VersionAction(argparse.Action):
    """``--version``: like argparse's own, but imports torch only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        import platform

        import torch

        sys.stdout.write(
            f"accel {accel_version()} (torch {torch.__version__}, "
            f"Python {platform.python_version()})\n"
        )
        parser.exit()


def _dispatch(
    args: argparse.Namespace,
    extra: list[str],
    parser: argparse.ArgumentParser,
    demo: argparse.ArgumentParser,
) -> int:
    if args.command == "conformance":
        return _run_conformance(args.backend, extra)
    if args.command == "demo":
        if extra:
            demo.error(f"unrecognized arguments: {' '.join(extra)}")
        run_demo(demo_config_from(args))
        return 0
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return _list(as_json=args.json)


#: inductor's advice on GPUs of compute capability 8.0 or more for an fp32 matmul compiled
#: without TF32 (torch/_inductor/compile_fx.py). Under a pytest configuration that turns
#: warnings into errors it fails the compile checks with BackendCompilerFailed, so the
#: conformance run ignores exactly this message (pyproject.toml does the same for tests).
TF32_ADVICE_FILTER = (
    "ignore:TensorFloat32 tensor cores for float32 matrix multiplication available but not "
    "enabled:UserWarning"
)


def _run_conformance(backend: str, pytest_args: Sequence[str]) -> int:
    import pytest

    arguments = [
        "-p",
        "accel.testing",
        "--pyargs",
        "accel.conformance",
        f"--accel={backend}",
        f"--accel-origin=`{_PROG} conformance {backend}`",
        "-W",
        TF32_ADVICE_FILTER,
    ]
    return int(pytest.main([*arguments, *pytest_args]))


def _list(*, as_json: bool) -> int:
    report = _report()
    if as_json:
        _write_json(report, sys.stdout)
    else:
        _print_table(report, sys.stdout)
    return 0


def _write_json(report: dict[str, Any], out: TextIO) -> None:
    json.dump(report, out, indent=2)
    out.write("\n")


def _report() -> dict[str, Any]:
    import torch

    backends = list_backends()
    try:
        # Create the pick, so that a backend whose factory fails is reported (and
        # auto-detection's fallback shown) here rather than in the user's program.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", BackendFallbackWarning)
            get_backend()
        selection = select_backend()
        selected: dict[str, Any] | None = dataclasses.asdict(selection)
        selection_error = None
    except AccelError as exc:
        selected, selection_error = None, str(exc)
    return {
        "accel_version": accel_version(),
        "torch_version": torch.__version__,
        "backends": [dataclasses.asdict(info) for info in backends],
        "selected": selected,
        "selection_error": selection_error,
        "plugin_failures": [
            {**dataclasses.asdict(failure.provider), "error": failure.error}
            for failure in plugin_failures()
        ],
    }


def _status(info: BackendInfo) -> str:
    if not info.available:
        return "unavailable"
    return "available" if info.automatic else "by name"


def _row(info: dict[str, Any]) -> tuple[str, ...]:
    record = BackendInfo(**info)
    provider = record.provider
    if provider != "built-in":
        provider = f"{provider} ({record.plugin})"
    return (
        record.name,
        provider,
        record.version,
        _status(record),
        str(record.device_count),
        str(record.priority),
    )


def _print_table(report: dict[str, Any], out: TextIO) -> None:
    rows = [_COLUMNS, *(_row(info) for info in report["backends"])]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    out.write(f"accel {report['accel_version']} (torch {report['torch_version']})\n\n")
    for row in rows:
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        out.write("  ".join(cells).rstrip())
        out.write("\n")
    # A conflicted name has one row per provider, all with the same reason: print it once.
    reasons = {info["name"]: info["reason"] for info in report["backends"] if not info["available"]}
    if reasons:
        out.write("\nWhy not available:\n")
        for name, reason in reasons.items():
            out.write(f"  {name}: {reason}\n")
    by_name = {
        info["name"]: info["reason"]
        for info in report["backends"]
        if info["available"] and not info.get("automatic", True)
    }
    if by_name:
        out.write("\nAvailable by name only (auto-detection passes them over):\n")
        for name, reason in by_name.items():
            out.write(f"  {name}: {reason}\n")
    for failure in report["plugin_failures"]:
        out.write(
            f"\nBroken plugin skipped: {failure['plugin']} from {failure['distribution']} "
            f"{failure['version']}: {failure['error']}\n"
        )
    selected = report["selected"]
    if selected is not None:
        reason = _REASON_TEXT[selected["reason"]]
        if selected["skipped"] and selected["reason"] == "fallback":
            reason = "fallback: no accelerator found could be created"
        out.write(f"\nget_backend() would pick: {selected['name']} ({reason})\n")
        for skipped in selected["skipped"]:
            name, error = skipped.split(": ", 1)
            out.write(f"  skipped {name}: it could not be created: {error}\n")
    else:
        out.write(f"\nget_backend() would fail: {report['selection_error']}\n")
