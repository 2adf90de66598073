"""Where OffloadModel's step goes on a CUDA GPU, under several device-memory caps.

``bench_offload.py`` gives one step time under its cap; this script splits it. On
``bench_offload.py``'s model (24 blocks of width 4096, 12.9 GB of float32 parameters,
24 slices, 4 micro-batches, checkpointed), it reports:

* the in-device step, plain and with every block checkpointed over 4 micro-batches (the
  compute an offloaded step cannot go below);
* per cap (``--caps``, GiB, enforced with ``torch.cuda.set_per_process_memory_fraction``):
  forward and backward times (medians of ``--steps``), how often the CUDA allocator had
  to free its cache and retry (each retry waits for the device), and the peaks;
* one step profiled under ``--profile-cap``: the time the GPU spent in kernels, in
  copies (each way) and in both at once, and the host's time in ``cudaFree`` and
  ``cudaEventSynchronize`` (the allocator's retries). ``--trace PATH`` keeps the
  Chrome trace.

``PYTORCH_CUDA_ALLOC_CONF`` is recorded; with ``expandable_segments:True`` the results
file is named ``offload-caps-expandable-...`` (the allocator's own answer to
fragmentation, for comparison).

Usage: python benchmarks/bench_offload_caps.py [--caps 3,6,20] [--steps 3] [--trace PATH]
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _offload_measure import make_model, timed_steps
from _report import print_table, write_results
from torch.utils.checkpoint import checkpoint

import accel
from accel import Accelerator
from offload import OffloadModel


def _sync() -> None:
    torch.cuda.synchronize()


def _union(spans: list[tuple[float, float]]) -> float:
    """Total length covered by ``spans`` (overlapping ones counted once)."""
    total, current = 0.0, None
    for start, end in sorted(spans):
        if current is None or start > current[1]:
            if current is not None:
                total += current[1] - current[0]
            current = [start, end]
        else:
            current[1] = max(current[1], end)
    if current is not None:
        total += current[1] - current[0]
    return total


def trace_figures(trace: dict[str, Any]) -> dict[str, float]:
    """GPU time (ms) in kernels, copies each way, both at once and neither, from a trace."""
    events = [
        e
        for e in trace["traceEvents"]
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    ]
    spans = {
        kind: [(e["ts"], e["ts"] + e["dur"]) for e in events if test(e)]
        for kind, test in {
            "kernels": lambda e: e["cat"] != "gpu_memcpy",
            "copies": lambda e: e["cat"] == "gpu_memcpy",
            "host_to_device": lambda e: e["cat"] == "gpu_memcpy" and "HtoD" in e["name"],
            "device_to_host": lambda e: e["cat"] == "gpu_memcpy" and "DtoH" in e["name"],
        }.items()
    }
    every = spans["kernels"] + spans["copies"]
    span = max(end for _, end in every) - min(start for start, _ in every)
    busy = _union(every)
    figures = {f"{kind}_ms": _union(found) / 1e3 for kind, found in spans.items()}
    figures["span_ms"] = span / 1e3
    figures["kernels_and_copies_at_once_ms"] = (
        figures["kernels_ms"] + figures["copies_ms"] - busy / 1e3
    )
    figures["idle_ms"] = (span - busy) / 1e3
    return figures


def _in_device(
    backend: Accelerator, reference: torch.nn.Module, x: torch.Tensor, micro: int, steps: int
) -> dict[str, float]:
    """The in-device step, plain and with every block checkpointed over micro-batches."""
    model = copy.deepcopy(reference).to(backend.device())
    inputs = x.to(backend.device())

    def plain() -> None:
        model(inputs).square().mean().backward()
        model.zero_grad(set_to_none=True)

    def checkpointed() -> None:
        for chunk in inputs.chunk(micro):
            hidden = chunk
            for block in model:
                hidden = checkpoint(block, hidden, use_reentrant=False)
            hidden.square().mean().backward()
        model.zero_grad(set_to_none=True)

    return {
        "plain_s": statistics.median(timed_steps(backend, plain, steps)),
        "checkpointed_microbatches_s": statistics.median(timed_steps(backend, checkpointed, steps)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=24)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--caps", default="3,6,20", help="device-memory caps in GiB")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--profile-cap", type=float, default=3.0)
    parser.add_argument("--trace", type=Path, default=None, help="keep the Chrome trace here")
    args = parser.parse_args()
    backend = accel.get_backend("cuda")  # the caps and the allocator's counters are CUDA's
    device = backend.device()
    torch.backends.cuda.matmul.allow_tf32 = True
    reference = make_model(args.blocks, args.width, 4 * args.width)
    x = torch.randn(args.tokens, args.width, generator=torch.Generator().manual_seed(1))

    compute = _in_device(backend, reference, x, args.microbatches, args.steps)
    gc.collect()
    _sync()
    torch.cuda.empty_cache()

    total = torch.cuda.get_device_properties(device).total_memory
    model = OffloadModel(
        copy.deepcopy(reference),
        num_slices=args.blocks,
        checkpoint_activation=True,
        num_microbatches=args.microbatches,
        backend=backend,
    )

    def split() -> tuple[float, float]:
        _sync()
        start = time.perf_counter()
        out = model(x)
        _sync()
        middle = time.perf_counter()
        out.square().mean().backward()
        _sync()
        end = time.perf_counter()
        model.zero_grad(set_to_none=True)
        return middle - start, end - middle

    def set_cap(gib: float) -> None:
        gc.collect()
        _sync()
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(min(1.0, gib * 2**30 / total), device)

    caps: dict[str, dict[str, Any]] = {}
    for gib in (float(cap) for cap in args.caps.split(",")):
        set_cap(gib)
        split()
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.reset_accumulated_memory_stats()
        parts = [split() for _ in range(args.steps)]
        stats = torch.cuda.memory_stats()
        caps[f"{gib:g} GiB"] = {
            "forward_s": statistics.median(p[0] for p in parts),
            "backward_s": statistics.median(p[1] for p in parts),
            "allocator_retries": stats.get("num_alloc_retries"),
            "peak_allocated_gib": stats.get("allocated_bytes.all.peak", 0) / 2**30,
            "peak_reserved_gib": stats.get("reserved_bytes.all.peak", 0) / 2**30,
        }

    set_cap(args.profile_cap)
    split()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        split()
    host = {
        event.key: {"ms": event.self_cpu_time_total / 1e3, "calls": event.count}
        for event in profiler.key_averages()
        if event.key in ("cudaFree", "cudaMalloc", "cudaEventSynchronize")
    }
    with tempfile.TemporaryDirectory() as folder:
        path = args.trace or Path(folder) / "trace.json"
        profiler.export_chrome_trace(str(path))
        gpu = trace_figures(json.loads(Path(path).read_text()))

    print(
        f"in-device: plain {compute['plain_s'] * 1e3:.0f} ms, every block checkpointed over "
        f"{args.microbatches} micro-batches {compute['checkpointed_microbatches_s'] * 1e3:.0f} ms\n"
    )
    print_table(
        ("cap", "forward", "backward", "allocator retries", "peak allocated", "peak reserved"),
        [
            (
                cap,
                f"{row['forward_s'] * 1e3:.0f} ms",
                f"{row['backward_s'] * 1e3:.0f} ms",
                row["allocator_retries"],
                f"{row['peak_allocated_gib']:.2f} GiB",
                f"{row['peak_reserved_gib']:.2f} GiB",
            )
            for cap, row in caps.items()
        ],
    )
    print(f"\none step profiled under {args.profile_cap:g} GiB (GPU, ms):")
    print_table(("figure", "ms"), [(name, f"{value:.1f}") for name, value in gpu.items()])
    print_table(
        ("host call", "ms", "calls"),
        [(name, f"{row['ms']:.1f}", row["calls"]) for name, row in host.items()],
    )
    allocator = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    path = write_results(
        "offload-caps"
        + ("-expandable" if allocator and "expandable_segments:True" in allocator else ""),
        backend.name,
        {
            "allocator_config": allocator,
            "model": {
                "blocks": args.blocks,
                "width": args.width,
                "tokens": args.tokens,
                "microbatches": args.microbatches,
            },
            "in_device": compute,
            "caps": caps,
            "profiled_cap_gib": args.profile_cap,
            "profiled_gpu_ms": gpu,
            "profiled_host_calls": host,
        },
    )
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
