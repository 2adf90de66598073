"""Offload throughput: OffloadModel against the plain model and fairscale's OffloadModel.

On a backend with streams (a GPU), the model is at least ``--min-ratio`` (4) times larger
than the device memory the script allows (``--budget-gib``, enforced with the vendor's
per-process memory fraction), and the script reports:

* pinned host-to-device and device-to-host bandwidth, measured first;
* the step time (forward + backward, until the gradients are in host memory; the host
  optimizer step is the same for every wrapper and is left out) of the in-device
  baseline where the model fits without the budget, of ours, and then of fairscale's
  OffloadModel on the same model and slices (only when ``import fairscale`` works; an
  out-of-memory error under the budget is recorded, and it is timed again under
  ``--fairscale-retry-gib``: see ``_offload_compare.py``);
* throughput against fairscale (target >= 2.5x) and overlap efficiency, defined as
  max(compute time, transfer time at the measured bandwidth) / step time (target >= 0.85).

On a backend without streams (the host), device and offload device are both the host:
the script reports the wrapper's own overhead, the median step time (forward, backward,
SGD step) of ``OffloadModel(num_slices=3)`` over the plain model (target < 1.05x).

With ``--host-copies LABEL`` it reports instead, per training step, the host copies made
by pinning and the host memory allocated for transfers (see ``_host_copies.py``).

Usage: python benchmarks/bench_offload.py [--backend NAME] [--steps N] [--budget-gib G]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _offload_compare import OUT_OF_MEMORY, release_memory, speedup_target, time_under_caps
from _report import print_table, write_results
from torch import nn

import accel
from accel import Accelerator
from offload import OffloadModel

CPU_OVERHEAD_TARGET = 1.05
FAIRSCALE_SPEEDUP_TARGET = 2.5
OVERLAP_TARGET = 0.85


def block(width: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))


def make_model(blocks: int, width: int, hidden: int, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(*[block(width, hidden) for _ in range(blocks)])


def parameter_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


# Host: the wrapper's overhead -------------------------------------------------------------


def cpu_mode(backend: Accelerator, args: argparse.Namespace) -> dict[str, Any]:
    if args.threads > 0:
        # The overhead measured is per-step Python and autograd work. On a shared machine
        # multi-threaded kernels spin on loaded cores and swamp it, so one thread by default.
        torch.set_num_threads(args.threads)
    width, hidden, blocks, batch = 512, 2048, 6, 64
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(1))
    variants: dict[str, nn.Module] = {
        "plain": make_model(blocks, width, hidden),
        "OffloadModel(num_slices=3)": OffloadModel(
            make_model(blocks, width, hidden), num_slices=3, backend=backend
        ),
        "OffloadModel(num_slices=3, checkpoint_activation=True)": OffloadModel(
            make_model(blocks, width, hidden),
            num_slices=3,
            checkpoint_activation=True,
            backend=backend,
        ),
    }
    optimizers = {
        name: torch.optim.SGD(model.parameters(), lr=1e-4) for name, model in variants.items()
    }

    def step(name: str) -> float:
        model, optimizer = variants[name], optimizers[name]
        start = time.perf_counter()
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        return time.perf_counter() - start

    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(3):  # warm-up
        for name in variants:
            step(name)
    for _ in range(args.steps):  # interleaved, so drifts in machine load hit every variant
        for name in variants:
            times[name].append(step(name))
    medians = {name: statistics.median(values) for name, values in times.items()}
    plain = medians["plain"]
    rows = []
    for name, median in medians.items():
        ratio = median / plain
        is_target = name == "OffloadModel(num_slices=3)"
        rows.append(
            (
                name,
                f"{median * 1e3:.2f} ms",
                f"{ratio:.3f}x",
                f"< {CPU_OVERHEAD_TARGET}x" if is_target else "-",
                (ratio < CPU_OVERHEAD_TARGET) if is_target else "-",
            )
        )
    print(
        f"backend: {backend.name}; model: {blocks} blocks of Linear({width},{hidden})-GELU-"
        f"Linear({hidden},{width}), {parameter_bytes(variants['plain']) / 2**20:.0f} MiB of "
        f"parameters; batch {batch}; threads {torch.get_num_threads()}; median of "
        f"{args.steps} interleaved steps (forward, backward, SGD step)\n"
    )
    print_table(("variant", "median step", "vs plain", "target", "met"), rows)
    overhead = medians["OffloadModel(num_slices=3)"] / plain
    return {
        "mode": "host overhead",
        "model": {"blocks": blocks, "width": width, "hidden": hidden, "batch": batch},
        "threads": torch.get_num_threads(),
        "steps": args.steps,
        "median_step_s": medians,
        "step_times_s": times,
        "targets": {
            "overhead_num_slices_3": {
                "value": overhead,
                "target": CPU_OVERHEAD_TARGET,
                "met": overhead < CPU_OVERHEAD_TARGET,
            }
        },
    }


# Device: throughput and overlap ------------------------------------------------------------


def bandwidth(backend: Accelerator, nbytes: int, repeats: int = 5) -> tuple[float, float]:
    """Return pinned host-to-device and device-to-host bandwidth in bytes per second."""
    host = backend.pin_memory(torch.empty(nbytes, dtype=torch.uint8))
    device = torch.empty(nbytes, dtype=torch.uint8, device=backend.device())
    results = []
    for direction in ("h2d", "d2h"):
        best = float("inf")
        for _ in range(repeats):
            backend.synchronize()
            start = time.perf_counter()
            if direction == "h2d":
                device.copy_(host, non_blocking=True)
            else:
                host.copy_(device, non_blocking=True)
            backend.synchronize()
            best = min(best, time.perf_counter() - start)
        results.append(nbytes / best)
    del host, device
    return results[0], results[1]


def timed_steps(backend: Accelerator, step: Callable[[], None], steps: int) -> list[float]:
    step()  # warm-up (allocations, pinning of gradient buffers, cuBLAS handles)
    backend.synchronize()
    times = []
    for _ in range(steps):
        backend.synchronize()
        start = time.perf_counter()
        step()
        backend.synchronize()
        times.append(time.perf_counter() - start)
    return times


def limit_device_memory(backend: Accelerator, budget: int) -> None:
    """Cap this process's device memory at ``budget`` bytes (vendor-specific)."""
    if backend.device_type == "cuda":
        total = torch.cuda.get_device_properties(backend.device()).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total), backend.device())
    else:
        raise SystemExit(f"no memory cap known for {backend.device_type!r}; add one here")


def allocator_retries(backend: Accelerator) -> int | None:
    """How often the allocator had to free its cache and retry (vendor-specific).

    Each retry waits for the device, so retries during our steps mean lost overlap.
    """
    if backend.device_type == "cuda":
        return int(torch.cuda.memory_stats(backend.device()).get("num_alloc_retries", 0))
    return None


def device_mode(backend: Accelerator, args: argparse.Namespace) -> dict[str, Any]:
    device = backend.device()
    if backend.device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    budget = int(args.budget_gib * 2**30)
    width, hidden, blocks = args.width, 4 * args.width, args.blocks
    tokens, slices, micro = args.tokens, args.slices or blocks, args.microbatches
    reference = make_model(blocks, width, hidden)
    model_bytes = parameter_bytes(reference)
    if model_bytes < args.min_ratio * budget:
        raise SystemExit(
            f"model of {model_bytes / 2**30:.1f} GiB is not {args.min_ratio}x the budget of "
            f"{args.budget_gib} GiB; raise --blocks or lower --budget-gib"
        )
    x = torch.randn(tokens, width, generator=torch.Generator().manual_seed(1))

    h2d, d2h = bandwidth(backend, min(1 << 30, budget // 4))
    print(f"pinned bandwidth: host->device {h2d / 1e9:.1f} GB/s, device->host {d2h / 1e9:.1f} GB/s")

    results: dict[str, list[float]] = {}

    # In-device baseline: only without the budget, and only where it fits.
    try:
        baseline = copy.deepcopy(reference).to(device)
        x_device = x.to(device)

        def baseline_step() -> None:
            baseline(x_device).square().mean().backward()
            baseline.zero_grad(set_to_none=True)

        results["in-device baseline (no budget)"] = timed_steps(backend, baseline_step, args.steps)
    except OUT_OF_MEMORY:
        print("the in-device baseline does not fit; compute time is estimated per slice")
    finally:
        baseline = None  # type: ignore[assignment]
        release_memory(backend)  # and the pinned bandwidth buffer, cached by torch

    limit_device_memory(backend, budget)

    # Ours first: fairscale may run out of memory under the cap, and must not take our
    # figures with it.
    ours = OffloadModel(
        copy.deepcopy(reference),
        num_slices=slices,
        checkpoint_activation=True,
        num_microbatches=micro,
        backend=backend,
    )

    def ours_step(model: nn.Module = ours) -> None:
        model(x).square().mean().backward()
        model.zero_grad(set_to_none=True)

    backend.reset_peak_memory_stats()
    retries_before = allocator_retries(backend)
    results["offload.OffloadModel"] = timed_steps(backend, ours_step, args.steps)
    del ours_step
    peak = backend.max_memory_allocated()
    retries = allocator_retries(backend)
    if retries is not None and retries_before is not None:
        retries -= retries_before
    del ours
    host_cache = release_memory(backend)

    fairscale_times, fairscale = compare_fairscale(backend, reference, x, args, slices, micro)
    if fairscale_times is not None:
        results["fairscale OffloadModel"] = fairscale_times
    print(f"fairscale OffloadModel: {fairscale['result']}")

    medians = {name: statistics.median(values) for name, values in results.items()}
    step_time = medians["offload.OffloadModel"]
    if "in-device baseline (no budget)" in medians:
        compute = medians["in-device baseline (no budget)"]
        compute_source = "in-device baseline"
    else:
        compute = float("nan")
        compute_source = "unavailable"
    # Per step: every slice comes in for forward and (but the two still resident) for
    # backward; every slice's gradients go out. One copy stream serialises both ways.
    slice_bytes = model_bytes / slices
    h2d_bytes = 2 * model_bytes - 2 * slice_bytes
    transfer = h2d_bytes / h2d + model_bytes / d2h
    overlap = max(compute, transfer) / step_time
    rows = [
        (name, f"{median * 1e3:.1f} ms", f"{tokens / median:,.0f} tokens/s")
        for name, median in medians.items()
    ]
    print(
        f"\nbackend: {backend.name}; model: {blocks} blocks, width {width}, "
        f"{model_bytes / 2**30:.1f} GiB of float32 parameters; device budget "
        f"{args.budget_gib} GiB ({model_bytes / budget:.1f}x smaller than the model); "
        f"{slices} slices, {micro} micro-batches, checkpointed; {tokens} tokens per step; "
        f"peak device memory {peak / 2**30:.2f} GiB; allocator retries during our steps: "
        f"{retries}\n"
    )
    print_table(("variant", "median step (fwd+bwd)", "throughput"), rows)
    summary = [
        ("transfer time at measured bandwidth", f"{transfer * 1e3:.1f} ms", "-", "-"),
        (f"compute time ({compute_source})", f"{compute * 1e3:.1f} ms", "-", "-"),
        ("overlap efficiency", f"{overlap:.3f}", f">= {OVERLAP_TARGET}", overlap >= OVERLAP_TARGET),
    ]
    targets: dict[str, Any] = {
        "overlap_efficiency": {
            "value": overlap,
            "target": OVERLAP_TARGET,
            "met": overlap >= OVERLAP_TARGET,
        }
    }
    if fairscale["result"] != "not installed":
        speedup = speedup_target(
            medians.get("fairscale OffloadModel"), step_time, fairscale, FAIRSCALE_SPEEDUP_TARGET
        )
        shown = "-" if speedup["value"] is None else f"{speedup['value']:.2f}x"
        met = "NOT PROVEN" if speedup["met"] is None else speedup["met"]
        summary.append(("throughput vs fairscale", shown, f">= {FAIRSCALE_SPEEDUP_TARGET}x", met))
        targets["speedup_vs_fairscale"] = speedup
    print()
    print_table(("measure", "value", "target", "met"), summary)
    return {
        "mode": "device throughput",
        "model": {
            "blocks": blocks,
            "width": width,
            "hidden": hidden,
            "bytes": model_bytes,
            "tokens": tokens,
            "slices": slices,
            "microbatches": micro,
        },
        "budget_bytes": budget,
        "bandwidth_bytes_per_s": {"h2d": h2d, "d2h": d2h},
        "median_step_s": medians,
        "step_times_s": results,
        "peak_device_bytes": peak,
        "allocator_retries_during_ours": retries,
        "fairscale": fairscale,
        "host_cache_release": host_cache,
        "transfer_time_s": transfer,
        "compute_time_s": compute,
        "targets": targets,
    }


def compare_fairscale(
    backend: Accelerator,
    reference: nn.Module,
    x: torch.Tensor,
    args: argparse.Namespace,
    slices: int,
    micro: int,
) -> tuple[list[float] | None, dict[str, Any]]:
    """Time fairscale's OffloadModel under the cap, then a raised cap if it runs out."""
    try:
        from fairscale.experimental.nn.offload import OffloadModel as FairscaleOffload
    except ImportError as exc:
        return None, {"result": "not installed", "error": str(exc)}
    device = backend.device()

    def build() -> nn.Module:
        return FairscaleOffload(
            copy.deepcopy(reference),
            device=device,
            offload_device=torch.device("cpu"),
            num_slices=slices,
            checkpoint_activation=True,
            num_microbatches=micro,
        )

    def time_steps(theirs: nn.Module) -> list[float]:
        def fairscale_step() -> None:
            theirs(x.to(device)).square().mean().backward()
            theirs.zero_grad(set_to_none=True)

        return timed_steps(backend, fairscale_step, args.steps)

    caps = [args.budget_gib] + ([args.fairscale_retry_gib] if args.fairscale_retry_gib else [])
    return time_under_caps(
        caps,
        build,
        time_steps,
        lambda cap: limit_device_memory(backend, int(cap * 2**30)),
        lambda: release_memory(backend),
    )


def host_copies(label: str) -> None:
    from _host_copies import measure

    payload = measure()
    rows = [
        (
            name,
            f"{figures['host_copies_per_step']:.1f}",
            f"{figures['host_copied_bytes_per_step'] / 2**20:.2f} MiB",
            f"{figures['host_allocated_bytes_per_step'] / 2**20:.2f} MiB",
            f"{figures['setup_host_copies']} / "
            f"{figures['setup_host_allocated_bytes'] / 2**20:.2f} MiB",
        )
        for name, figures in payload["workloads"].items()
    ]
    print(f"{label}: per step, every device copy forced on, pinning counted\n")
    print_table(
        ("workload", "host copies", "copied", "host memory allocated", "setup: copies / memory"),
        rows,
    )
    path = write_results("offload-host-copies", label, {"mode": "host copies", **payload})
    print(f"\nwrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default=None, help="backend name (default: auto)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (20 host, 5 device)")
    parser.add_argument("--budget-gib", type=float, default=3.0, help="device memory allowed")
    parser.add_argument("--min-ratio", type=float, default=4.0, help="model size / budget")
    parser.add_argument(
        "--fairscale-retry-gib",
        type=float,
        default=6.0,
        help="cap for a second fairscale run if it runs out of memory under --budget-gib "
        "(0: no second run)",
    )
    parser.add_argument("--blocks", type=int, default=24, help="MLP blocks (device mode)")
    parser.add_argument("--width", type=int, default=4096, help="model width (device mode)")
    parser.add_argument("--tokens", type=int, default=4096, help="rows per step (device mode)")
    parser.add_argument("--slices", type=int, default=0, help="slices (default: one per block)")
    parser.add_argument("--microbatches", type=int, default=4, help="micro-batches (device)")
    parser.add_argument(
        "--threads", type=int, default=1, help="host threads in host mode (0: torch's default)"
    )
    parser.add_argument(
        "--host-copies",
        default=None,
        metavar="LABEL",
        help="report host memory and host copies per step instead, labelled LABEL",
    )
    args = parser.parse_args()

    if args.host_copies:
        host_copies(args.host_copies)
        return
    backend = accel.get_backend(args.backend)
    if backend.supports_streams:
        args.steps = args.steps or 5
        payload = device_mode(backend, args)
    else:
        args.steps = args.steps or 20
        payload = cpu_mode(backend, args)
    path = write_results("offload", backend.name, payload)
    print(f"\nwrote {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")


if __name__ == "__main__":
    main()
