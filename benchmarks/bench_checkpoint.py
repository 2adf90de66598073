"""Activation checkpointing: step time and memory, ours against torch's and none.

On the selected backend, a stack of transformer blocks is trained with five variants:
no checkpointing, ``torch.utils.checkpoint`` (reentrant and non-reentrant) and
``checkpointing.checkpoint`` (reentrant and non-reentrant), every block checkpointed.

Measures:
* step time: median over ``--steps`` rounds after ``--warmup``; each round runs one step
  of every variant, in a rotating order, so machine drift affects them alike, and the
  ratios are medians of per-round ratios; the backend is synchronized before each
  timer read;
* saved activations: bytes of the distinct non-parameter tensors autograd holds for
  backward at the end of the forward (counted with ``saved_tensors_hooks``);
* peak memory: the device's peak allocation through the backend where it keeps memory
  statistics; otherwise (the host) the peak RSS (``VmHWM``, reset after setup) of a
  fresh child process per variant that runs two steps, with and without its RSS after
  setup subtracted. The children run one tiny step first, so that lazy imports are part
  of setup, and use ``MALLOC_MMAP_THRESHOLD_=65536``, so that freed activations leave
  the RSS at once rather than staying in glibc's heap.

Targets (reported, not asserted): our step time within 2% of torch's for the same
variant; our saved activations and peak memory no higher than torch's (on the host: the peak
RSS above the RSS after setup, with a 1% allowance for allocator noise; the absolute
peak also counts what torch's checkpoint imports on first use); our step time under
1.40x the step without checkpointing.

With ``--compile [BACKEND]`` every variant's training step is compiled with
``torch.compile`` (default backend: the accel backend's ``compile_backend``), so ours and
torch's are compared as a compiled model runs them; results go to
``checkpoint-compile-*.json`` and the peak-RSS children are skipped.

Usage: python benchmarks/bench_checkpoint.py [--backend NAME] [--layers N] [--d-model N]
       [--heads N] [--ffn N] [--seq N] [--batch N] [--dropout-percent N] [--warmup N]
       [--steps N] [--threads N] [--no-rss] [--compile [BACKEND]]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.utils.checkpoint
from _report import print_table, write_results
from torch import nn

import accel
import checkpointing
from accel import Accelerator
from checkpointing import SavedTensorMeter

VARIANTS = (
    "none",
    "torch-reentrant",
    "torch-non-reentrant",
    "ours-reentrant",
    "ours-non-reentrant",
)
TIME_TARGET = 1.02
OVERHEAD_TARGET = 1.40
RSS_ALLOWANCE = 1.01
RSS_STEPS = 2  # the peak is reached in the first step; the second shows it is stable


class Stack(nn.Module):
    """Input projection, ``layers`` transformer blocks, output projection."""

    def __init__(self, config: dict[str, int]) -> None:
        super().__init__()
        width = config["d_model"]
        self.embed = nn.Linear(width, width)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(
                width,
                config["heads"],
                config["ffn"],
                dropout=config["dropout_percent"] / 100,
                batch_first=True,
            )
            for _ in range(config["layers"])
        )
        self.head = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, run_block: Callable[[nn.Module, torch.Tensor], Any]) -> Any:
        h = self.embed(x)
        for block in self.blocks:
            h = run_block(block, h)
        return self.head(h)


def block_runner(variant: str, backend: Accelerator) -> Callable[[nn.Module, torch.Tensor], Any]:
    """Return how a block is called for ``variant``."""
    if variant == "none":
        return lambda block, h: block(h)
    reentrant = variant.endswith("-reentrant") and not variant.endswith("non-reentrant")
    if variant.startswith("torch-"):
        return lambda block, h: torch.utils.checkpoint.checkpoint(block, h, use_reentrant=reentrant)
    return lambda block, h: checkpointing.checkpoint(
        block, h, use_reentrant=reentrant, backend=backend
    )


class Workload:
    """One model copy per variant, the same data, and a training step."""

    def __init__(
        self,
        backend: Accelerator,
        config: dict[str, int],
        variants: tuple[str, ...],
        compile_backend: str | None = None,
    ):
        self.backend = backend
        device = backend.device()
        torch.manual_seed(0)
        base = Stack(config).to(device).train()
        self.models = {variant: copy.deepcopy(base) for variant in variants}
        self.runners = {variant: block_runner(variant, backend) for variant in variants}
        self.forwards: dict[str, Callable[[torch.Tensor], Any]] = {}
        for variant in variants:
            model, runner = self.models[variant], self.runners[variant]

            def forward(x: torch.Tensor, model: nn.Module = model, runner: Any = runner) -> Any:
                return model(x, runner)

            self.forwards[variant] = (
                forward
                if compile_backend is None
                else torch.compile(forward, backend=compile_backend, fullgraph=True)
            )
        generator = torch.Generator().manual_seed(1)
        shape = (config["batch"], config["seq"], config["d_model"])
        self.x = torch.randn(*shape, generator=generator).to(device)
        self.target = torch.randn(*shape, generator=generator).to(device)

    def forward_loss(self, variant: str) -> torch.Tensor:
        out = self.forwards[variant](self.x)
        return nn.functional.mse_loss(out, self.target)

    def step(self, variant: str) -> float:
        """Run forward and backward; return the seconds it took, device work included."""
        self.backend.synchronize()
        start = time.perf_counter()
        self.forward_loss(variant).backward()
        self.backend.synchronize()
        elapsed = time.perf_counter() - start
        self.models[variant].zero_grad(set_to_none=True)
        return elapsed

    def saved_bytes(self, variant: str) -> int:
        """Bytes of distinct non-parameter storages autograd holds after the forward."""
        with SavedTensorMeter(exclude=self.models[variant].parameters()) as meter:
            loss = self.forward_loss(variant)
        held = meter.bytes
        loss.backward()
        self.models[variant].zero_grad(set_to_none=True)
        return held

    def peak_device_bytes(self, variant: str) -> int:
        """Peak device allocation of one step beyond what was allocated before it."""
        self.backend.synchronize()
        before = self.backend.memory_allocated()
        self.backend.reset_peak_memory_stats()
        self.step(variant)
        return self.backend.max_memory_allocated() - before


def child_peak_rss(variant: str, args: argparse.Namespace) -> dict[str, int]:
    """Run ``variant`` in a fresh process; return its peak RSS and its RSS after setup."""
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        variant,
        "--config",
        json.dumps(config_of(args)),
        "--steps",
        str(RSS_STEPS),
        "--threads",
        str(args.threads),
    ]
    if args.backend:
        command += ["--backend", args.backend]
    # A fixed mmap threshold makes glibc return freed large blocks to the system at
    # once, so the RSS follows live memory instead of the allocator's high-water mark.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 16)}
    done = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
    report: dict[str, int] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def _rss_kb(field: str) -> int:
    """Read ``VmRSS`` or ``VmHWM`` (peak) of this process from /proc, in KiB.

    ``ru_maxrss`` is no use here: Linux carries it over ``fork`` and ``exec``, so a
    child reports at least its parent's peak. Without /proc it is the fallback.
    """
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _reset_peak_rss() -> None:
    """Start a new ``VmHWM`` at the current RSS (Linux 4.0+), where /proc allows it."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def run_child(args: argparse.Namespace) -> None:
    """The child side of :func:`child_peak_rss`: setup, steps, then print the figures.

    One step on a tiny batch first loads what the variant imports lazily (torch's
    checkpoint imports its compiler stack on first use), so that import memory is not
    counted as activation memory; then the peak is reset and the real steps run.
    """
    backend = accel.get_backend(args.backend)
    config = json.loads(args.config)
    Workload(backend, {**config, "batch": 1, "seq": 2}, (args.child,)).step(args.child)
    workload = Workload(backend, config, (args.child,))
    setup_kb = _rss_kb("VmRSS")
    _reset_peak_rss()
    for _ in range(args.steps):
        workload.step(args.child)
    peak_kb = _rss_kb("VmHWM")
    print(json.dumps({"peak_rss_kb": peak_kb, "setup_rss_kb": setup_kb}))


def config_of(args: argparse.Namespace) -> dict[str, int]:
    return {
        "layers": args.layers,
        "d_model": args.d_model,
        "heads": args.heads,
        "ffn": args.ffn,
        "seq": args.seq,
        "batch": args.batch,
        "dropout_percent": args.dropout_percent,
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default=None, help="backend name (default: auto)")
    parser.add_argument("--layers", type=int, default=4, help="transformer blocks")
    parser.add_argument("--d-model", type=int, default=256, help="model width")
    parser.add_argument("--heads", type=int, default=4, help="attention heads")
    parser.add_argument("--ffn", type=int, default=1024, help="feed-forward width")
    parser.add_argument("--seq", type=int, default=128, help="sequence length")
    parser.add_argument("--batch", type=int, default=8, help="batch size")
    parser.add_argument(
        "--dropout-percent", type=int, default=10, help="dropout of each block, in percent"
    )
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per variant")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per variant")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads, 0 for torch's default (default 1: on a small shared "
        "machine, multi-threaded kernels stall whenever another process takes a core, "
        "which makes single steps 10x slower at random)",
    )
    parser.add_argument("--no-rss", action="store_true", help="skip the child processes")
    parser.add_argument(
        "--compile",
        nargs="?",
        const="",
        default=None,
        help="compile each variant with torch.compile (default backend: the accel "
        "backend's compile_backend)",
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--config", default=None, help=argparse.SUPPRESS)
    return parser.parse_args()


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**20:.1f} MB"


def main() -> None:
    args = parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.child:
        run_child(args)
        return
    backend = accel.get_backend(args.backend)
    config = config_of(args)
    compile_backend = None
    if args.compile is not None:
        compile_backend = args.compile or backend.compile_backend
        args.no_rss = True
    workload = Workload(backend, config, VARIANTS, compile_backend)

    saved = {variant: workload.saved_bytes(variant) for variant in VARIANTS}
    for _ in range(args.warmup):
        for variant in VARIANTS:
            workload.step(variant)
    times: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    for round_index in range(args.steps):
        # Rotate the order so that no variant always runs first (cold) or last.
        shift = round_index % len(VARIANTS)
        for variant in VARIANTS[shift:] + VARIANTS[:shift]:
            times[variant].append(workload.step(variant))
    median = {variant: statistics.median(times[variant]) for variant in VARIANTS}

    def paired_ratio(numerator: str, denominator: str) -> float:
        """Median over rounds of the per-round ratio: robust to drift between rounds."""
        return statistics.median(
            a / b for a, b in zip(times[numerator], times[denominator], strict=True)
        )

    device_peak: dict[str, int] = {}
    if backend.supports_memory_stats:
        device_peak = {variant: workload.peak_device_bytes(variant) for variant in VARIANTS}
    rss: dict[str, dict[str, int]] = {}
    if not backend.supports_memory_stats and not args.no_rss:
        rss = {variant: child_peak_rss(variant, args) for variant in VARIANTS}

    def peak(variant: str) -> float | None:
        if device_peak:
            return float(device_peak[variant])
        if rss:
            return float(rss[variant]["peak_rss_kb"] * 1024)
        return None

    def peak_delta(variant: str) -> float | None:
        if not rss:
            return None
        return float((rss[variant]["peak_rss_kb"] - rss[variant]["setup_rss_kb"]) * 1024)

    def training_peak(variant: str) -> float | None:
        """What the target compares: device peak, or the RSS peak above setup."""
        return peak_delta(variant) if rss else peak(variant)

    targets: dict[str, Any] = {}
    for mode in ("reentrant", "non-reentrant"):
        ours, theirs = f"ours-{mode}", f"torch-{mode}"
        time_ratio = paired_ratio(ours, theirs)
        overhead = paired_ratio(ours, "none")
        ours_peak, their_peak = training_peak(ours), training_peak(theirs)
        allowance = RSS_ALLOWANCE if rss else 1.0
        memory_met = saved[ours] <= saved[theirs] and (
            ours_peak is None or their_peak is None or ours_peak <= their_peak * allowance
        )
        targets[mode] = {
            "time_vs_torch": {
                "ratio": time_ratio,
                "target": f"<= {TIME_TARGET}",
                "met": time_ratio <= TIME_TARGET,
            },
            "memory_vs_torch": {
                "saved_bytes": [saved[ours], saved[theirs]],
                "peak_bytes": [ours_peak, their_peak],
                "target": "saved <= torch's and peak <= torch's"
                + (f" x {RSS_ALLOWANCE} (peak RSS above setup)" if rss else ""),
                "met": memory_met,
            },
            "overhead_vs_none": {
                "ratio": overhead,
                "target": f"< {OVERHEAD_TARGET}",
                "met": overhead < OVERHEAD_TARGET,
            },
        }

    peak_kind = "device peak" if device_peak else "peak RSS" if rss else "peak"
    rows = []
    for variant in VARIANTS:
        counterpart = variant.replace("ours-", "torch-")
        rows.append(
            (
                variant,
                f"{median[variant] * 1000:.1f} ms",
                f"{paired_ratio(variant, 'none'):.3f}x",
                f"{paired_ratio(variant, counterpart):.3f}x"
                if variant.startswith("ours-")
                else "-",
                _mb(saved[variant]),
                _mb(peak(variant)),
                _mb(peak_delta(variant)),
            )
        )
    print(
        f"backend: {backend.name}; config: {config}; {args.steps} timed rounds; "
        f"{torch.get_num_threads()} torch thread(s); "
        f"torch.compile: {compile_backend or 'no'}\n"
    )
    print_table(
        (
            "variant",
            "median step",
            "vs none",
            "vs torch",
            "saved activations",
            peak_kind,
            "peak - setup",
        ),
        rows,
    )
    print("(ratios: median over rounds of the per-round ratio)")
    print()
    target_rows = []
    for mode, result in targets.items():
        for name, target in result.items():
            value = (
                f"{target['ratio']:.3f}"
                if "ratio" in target
                else f"saved {_mb(target['saved_bytes'][0])} vs {_mb(target['saved_bytes'][1])}; "
                f"peak {_mb(target['peak_bytes'][0])} vs {_mb(target['peak_bytes'][1])}"
            )
            target_rows.append(
                (mode, name, value, target["target"], "yes" if target["met"] else "no")
            )
    print_table(("mode", "target", "value", "wanted", "met"), target_rows)

    all_met = all(t["met"] for result in targets.values() for t in result.values())
    path = write_results(
        "checkpoint" if compile_backend is None else "checkpoint-compile",
        backend.name,
        {
            "config": {
                **config,
                "warmup": args.warmup,
                "steps": args.steps,
                "torch_threads": torch.get_num_threads(),
                "compile_backend": compile_backend,
            },
            "torch_version": torch.__version__,
            "accel_version": accel.__version__,
            "results": {
                variant: {
                    "median_step_s": median[variant],
                    "step_s": times[variant],
                    "saved_activation_bytes": saved[variant],
                    "device_peak_bytes": device_peak.get(variant),
                    "peak_rss_kb": rss.get(variant, {}).get("peak_rss_kb"),
                    "setup_rss_kb": rss.get(variant, {}).get("setup_rss_kb"),
                }
                for variant in VARIANTS
            },
            "targets": targets,
            "targets_met": "yes" if all_met else "no",
        },
    )
    print(f"\nall targets met: {'yes' if all_met else 'no'}")
    print(f"wrote {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")


if __name__ == "__main__":
    main()
