"""``python -m accel demo``: one small GPT trained plain, checkpointed, offloaded, budgeted.

Each run happens in a fresh process (so its peak RSS is its own) with the same seed and
data. The table shows step time, activation memory, peak RSS, the final loss, and
whether the first step's gradients equal the plain run's. The fourth run checkpoints
to a memory budget of half the plain activation memory (``memory_budget=0.5``).
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
from collections.abc import Sequence
from typing import TextIO

from ._demo_config import VARIANTS, DemoConfig, RunResult
from ._demo_train import quiet_child, train

__all__ = ["DemoConfig", "RunResult", "add_arguments", "run_demo"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the demo's options to ``parser``."""
    defaults = DemoConfig()
    parser.add_argument("--steps", type=int, default=defaults.steps, help="training steps")
    parser.add_argument("--layers", type=int, default=defaults.layers, help="transformer blocks")
    parser.add_argument("--width", type=int, default=defaults.width, help="model width")
    parser.add_argument("--heads", type=int, default=defaults.heads, help="attention heads")
    parser.add_argument("--sequence", type=int, default=defaults.sequence, help="tokens per row")
    parser.add_argument("--batch", type=int, default=defaults.batch, help="rows per step")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="random seed")
    parser.add_argument("--backend", default=None, help="backend name (default: get_backend())")
    parser.add_argument("--plot", metavar="FILE.png", default=None, help="draw memory and loss")


def config_from(args: argparse.Namespace) -> DemoConfig:
    """Build a :class:`DemoConfig` from parsed arguments, rejecting impossible sizes."""
    config = DemoConfig(**{name: getattr(args, name) for name in DemoConfig.__dataclass_fields__})
    for name in ("steps", "layers", "width", "heads", "sequence", "batch"):
        if getattr(config, name) < 1:
            raise SystemExit(
                f"accel demo: --{name} must be at least 1, got {getattr(config, name)}."
            )
    if config.width % config.heads:
        raise SystemExit(
            f"accel demo: --width {config.width} is not divisible by --heads {config.heads}; "
            "pick a width that is a multiple of the head count."
        )
    return config


def run_demo(config: DemoConfig, out: TextIO = sys.stdout) -> list[RunResult]:
    """Train every variant, print the table, draw the plot if asked; return results."""
    import accel

    backend_name = accel.get_backend(config.backend).name
    out.write(
        f"accel demo on backend {backend_name!r}: a {config.layers}-block GPT "
        f"(width {config.width}) trained {config.steps} steps, {len(VARIANTS)} ways\n"
    )
    out.flush()
    context = multiprocessing.get_context("spawn")
    results: list[RunResult] = []
    for variant in VARIANTS:
        with context.Pool(1, initializer=quiet_child) as pool:
            results.append(pool.apply(train, (variant, config)))
    _print_table(results, out)
    if config.plot:
        from ._demo_plot import draw

        draw(results, config.plot)
        out.write(f"\nwrote {config.plot}\n")
    return results


# Report -----------------------------------------------------------------------------


def _megabytes(value: int) -> str:
    return f"{value / 2**20:.1f} MiB"


def gradient_agreement(result: RunResult, reference: RunResult) -> str:
    """Say whether ``result``'s first gradients equal ``reference``'s, or how far apart."""
    import torch

    pairs = list(zip(result.first_gradients, reference.first_gradients, strict=True))
    if all(torch.equal(a, b) for a, b in pairs):
        return "yes (bit-exact)"
    difference = max(float((a - b).abs().max()) for a, b in pairs)
    return f"within {difference:.1e}" if difference < 1e-4 else f"NO (max diff {difference:.1e})"


def _print_table(results: Sequence[RunResult], out: TextIO) -> None:
    plain = results[0]
    headers = (
        "run",
        "step time",
        f"activations ({plain.memory_kind})",
        "peak RSS",
        "final loss",
        "grads = plain",
    )
    rows = [
        (
            result.variant,
            f"{statistics.median(result.step_seconds) * 1000:.1f} ms",
            _megabytes(result.activation_bytes),
            _megabytes(result.peak_rss_bytes),
            f"{result.losses[-1]:.4f}",
            "reference" if result is plain else gradient_agreement(result, plain),
        )
        for result in results
    ]
    table = [headers, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(headers))]
    out.write("\n")
    for index, row in enumerate(table):
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        out.write("\n")
        if index == 0:
            out.write("  ".join("-" * w for w in widths) + "\n")
    if plain.memory_kind == "live tensors after forward":
        out.write(
            "\nActivations: bytes of the tensors the first forward created that are still "
            "alive at its end (the host\nhas no device memory statistics): what autograd "
            "saves, what a selective checkpoint keeps, the output.\nOffload keeps its "
            "slice inputs in host memory, which on the host is the same memory: compare "
            "peak RSS.\n"
        )
