"""Offload throughput: OffloadModel against the copy floor and today's peers.

On a backend with streams (a GPU), the model is at least ``--min-ratio`` (4) times larger
than the device memory the script allows (``--budget-gib``, enforced with the vendor's
per-process memory fraction), and the script reports, in one run on the same model and
cap:

* pinned host-to-device and device-to-host bandwidth, measured first, and the copy floor
  they set: a step loads every parameter twice (forward, then backward) and stores every
  gradient once; with loads and stores on separate copy engines forward plus backward
  cannot be shorter than the longer direction (the loads);
* forward plus backward (what offload controls, until the gradients are in host memory)
  of the in-device baseline where the model fits without the budget (plain, and every
  block checkpointed over the micro-batches: the compute ours must do), of ours, then of
  today's peers on the same blocks: FSDP2 with ``CPUOffloadPolicy`` (one unit per block,
  world size 1), fairscale's OffloadModel (only when ``import fairscale`` works; an
  out-of-memory error under the budget is recorded, and it is timed again under
  ``--fairscale-retry-gib``: see ``_offload_compare.py``) and DeepSpeed ZeRO-3 with
  parameters and optimizer offloaded to the host (where ``import deepspeed`` works; in a
  child process with a time limit): see ``_offload_peers.py``. A peer that cannot run
  is recorded with the reason, never a crash;
* the full step: the same host optimizer (SGD) for every wrapper, its time apart;
* the device tensors of a weight's size or more that backward allocates, counted at the
  dispatch level (``bench_backward_allocations.py``): on the host with every copy forced on,
  for both wrappers and both strategies (every run, the smoke run included), and on the
  device for ours (one more step after the timed ones);
* a top-level ``summary`` (``step_over_floor``, ``overlap_efficiency``,
  ``allocator_retries``, ``backward_allocations``, ``backward_allocations_on_device``,
  ``fsdp2_step_ratio``, ``fairscale_speedup``, ``device``) and the targets, printed met or
  missed: forward plus backward <= 1.15x the copy floor; overlap efficiency, max(compute,
  loads, stores) / forward plus backward, >= 0.85; no CUDA allocator retries during our
  steps; no weight-sized allocation in our backward; faster than FSDP2; >= 2.5x
  fairscale.

The device run is ``_offload_device.py``'s; the model, the cap and the timed steps are
``_offload_measure.py``'s.

``--smoke`` runs the same path on the host with a tiny model and no cap (CI and tests:
the JSON and its summary keys; figures that need a GPU are null, with a reason).

On a backend without streams (the host), device and offload device are both the host:
the script reports the wrapper's own overhead, the median step time (forward, backward,
SGD step) of ``OffloadModel(num_slices=3)`` over the plain model (target < 1.05x).

With ``--host-copies LABEL`` it reports instead, per training step, the host copies made
by pinning and the host memory allocated for transfers (see ``_host_copies.py``).

Usage: python benchmarks/bench_offload.py [--backend NAME] [--steps N] [--budget-gib G]
       python benchmarks/bench_offload.py --smoke [--results-dir DIR]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from _offload_compare import deepspeed_peer
from _offload_device import device_mode
from _offload_measure import make_model, parameter_bytes
from _report import print_table, write_results
from torch import nn

import accel
from accel import Accelerator
from offload import OffloadModel

CPU_OVERHEAD_TARGET = 1.05
#: The smoke run's model: small enough for CI's two shared cores.
SMOKE_MODEL = {"blocks": 4, "width": 32, "tokens": 16, "microbatches": 2, "steps": 2}


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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backend", default=None, help="backend name (default: auto)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (20 host, 5 device)")
    parser.add_argument("--budget-gib", type=float, default=3.0, help="device memory allowed")
    parser.add_argument("--min-ratio", type=float, default=4.0, help="model size / budget")
    parser.add_argument(
        "--fairscale-retry-gib",
        type=float,
        default=6.0,
        help="cap for a second run of a peer (fairscale, FSDP2) that runs out of memory "
        "under --budget-gib (0: no second run)",
    )
    parser.add_argument(
        "--deepspeed-timeout-s",
        type=float,
        default=150.0,
        help="time allowed to DeepSpeed's child process, start and steps included",
    )
    parser.add_argument(
        "--deadline-s",
        type=float,
        default=0.0,
        help="start no peer after this many seconds, so a run with a time limit still "
        "writes its JSON (0: no deadline)",
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
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the device comparison on the host with a tiny model (CI: the JSON's keys)",
    )
    parser.add_argument(
        "--results-dir", type=Path, default=None, help="write the JSON here (default: results/)"
    )
    parser.add_argument("--peer", choices=["deepspeed"], default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.host_copies:
        host_copies(args.host_copies)
        return
    if args.peer == "deepspeed":  # the child process of compare_deepspeed
        args.steps = args.steps or 5
        deepspeed_peer(accel.get_backend(args.backend), args)
        return
    if args.smoke:
        for name, value in SMOKE_MODEL.items():
            setattr(args, name, value)
        torch.set_num_threads(max(1, args.threads))
        backend = accel.get_backend(args.backend or "cpu")
        payload = device_mode(backend, args)
        name = "offload-smoke"
    else:
        backend = accel.get_backend(args.backend)
        name = "offload"
        if backend.supports_streams:
            args.steps = args.steps or 5
            payload = device_mode(backend, args)
        else:
            args.steps = args.steps or 20
            payload = cpu_mode(backend, args)
    path = write_results(name, backend.name, payload, args.results_dir)
    print(f"\nwrote {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")


if __name__ == "__main__":
    main()
