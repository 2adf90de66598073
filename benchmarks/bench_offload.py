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
import copy
import json
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from _offload_compare import OUT_OF_MEMORY, release_memory, speedup_target, time_under_caps
from _report import print_table, write_results
from bench_backward_allocations import device_figures, host_figures
from torch import nn
from torch.utils.checkpoint import checkpoint

import accel
from accel import Accelerator
from offload import OffloadModel

CPU_OVERHEAD_TARGET = 1.05
FAIRSCALE_SPEEDUP_TARGET = 2.5
OVERLAP_TARGET = 0.85
FLOOR_TARGET = 1.15
#: The smoke run's model: small enough for CI's two shared cores.
SMOKE_MODEL = {"blocks": 4, "width": 32, "tokens": 16, "microbatches": 2, "steps": 2}


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


def cap_memory(backend: Accelerator, args: argparse.Namespace, gib: float) -> None:
    """Cap device memory at ``gib`` GiB; a smoke run on the host has nothing to cap."""
    if not getattr(args, "smoke", False):
        limit_device_memory(backend, int(gib * 2**30))


def peer_caps(args: argparse.Namespace) -> list[float]:
    """The caps a peer is tried under: the budget, then the raised cap if one is set."""
    return [args.budget_gib] + ([args.fairscale_retry_gib] if args.fairscale_retry_gib else [])


def allocator_retries(backend: Accelerator) -> int | None:
    """How often the allocator had to free its cache and retry (vendor-specific).

    Each retry waits for the device, so retries during our steps mean lost overlap.
    """
    if backend.device_type == "cuda":
        return int(torch.cuda.memory_stats(backend.device()).get("num_alloc_retries", 0))
    return None


def timed_training(
    backend: Accelerator,
    forward_backward: Callable[[], None],
    optimizer_step: Callable[[], None],
    steps: int,
) -> dict[str, list[float]]:
    """Time forward plus backward, then the host optimizer's step (and zero_grad) apart."""
    forward_backward()  # warm-up (allocations, pinning of gradient buffers, cuBLAS handles)
    optimizer_step()
    times: dict[str, list[float]] = {"forward_backward": [], "optimizer": []}
    for _ in range(steps):
        backend.synchronize()
        start = time.perf_counter()
        forward_backward()
        backend.synchronize()
        middle = time.perf_counter()
        optimizer_step()
        backend.synchronize()
        times["forward_backward"].append(middle - start)
        times["optimizer"].append(time.perf_counter() - middle)
    return times


def host_optimizer(parameters: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """The optimizer every wrapper steps with, on the host: SGD, the cheapest pass."""
    return torch.optim.SGD(parameters, lr=1e-6)


def train(
    backend: Accelerator, model: nn.Module, x: torch.Tensor, steps: int
) -> dict[str, list[float]]:
    """Time ``model`` on ``x`` with the host optimizer (forward plus backward, then the step)."""
    optimizer = host_optimizer(model.parameters())

    def forward_backward() -> None:
        model(x).square().mean().backward()

    def optimizer_step() -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return timed_training(backend, forward_backward, optimizer_step, steps)


def copy_floor(model_bytes: int, h2d: float, d2h: float) -> dict[str, float]:
    """The shortest forward plus backward the copies allow, at the measured bandwidth.

    A step moves every parameter to the device twice (forward, then backward) and every
    gradient back once; with loads and stores on separate copy engines the step cannot be
    shorter than the longer of the two directions (the loads, at equal bandwidth).
    """
    loads, stores = 2 * model_bytes / h2d, model_bytes / d2h
    return {
        "load_bytes": 2 * model_bytes,
        "store_bytes": model_bytes,
        "loads_s": loads,
        "stores_s": stores,
        "floor_s": max(loads, stores),
    }


def _median(times: dict[str, list[float]] | None, key: str = "forward_backward") -> float | None:
    return statistics.median(times[key]) if times else None


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return numerator / denominator if numerator and denominator else None


def device_mode(backend: Accelerator, args: argparse.Namespace) -> dict[str, Any]:
    began = time.monotonic()
    device = backend.device()
    cuda = backend.device_type == "cuda"
    smoke = bool(getattr(args, "smoke", False))
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    budget = int(args.budget_gib * 2**30)
    width, hidden, blocks = args.width, 4 * args.width, args.blocks
    tokens, slices, micro = args.tokens, args.slices or blocks, args.microbatches
    reference = make_model(blocks, width, hidden)
    model_bytes = parameter_bytes(reference)
    if not smoke and model_bytes < args.min_ratio * budget:
        raise SystemExit(
            f"model of {model_bytes / 2**30:.1f} GiB is not {args.min_ratio}x the budget of "
            f"{args.budget_gib} GiB; raise --blocks or lower --budget-gib"
        )
    x = torch.randn(tokens, width, generator=torch.Generator().manual_seed(1))

    h2d, d2h = bandwidth(backend, max(1 << 20, min(1 << 30, budget // 4)))
    floor = copy_floor(model_bytes, h2d, d2h)
    print(f"pinned bandwidth: host->device {h2d / 1e9:.1f} GB/s, device->host {d2h / 1e9:.1f} GB/s")

    results: dict[str, list[float]] = {}
    training: dict[str, dict[str, list[float]]] = {}

    # In-device baseline: only without the budget, and only where it fits. Plain, and
    # with every block checkpointed over the micro-batches (the compute ours must do).
    baseline: nn.Sequential | None = None
    try:
        baseline = copy.deepcopy(reference).to(device)
        x_device = x.to(device)

        def baseline_step() -> None:
            assert baseline is not None
            baseline(x_device).square().mean().backward()
            baseline.zero_grad(set_to_none=True)

        def checkpointed_step() -> None:
            assert baseline is not None
            for chunk in x_device.chunk(micro):
                hidden_state: Any = chunk
                for layer in baseline:
                    hidden_state = checkpoint(layer, hidden_state, use_reentrant=False)
                hidden_state.square().mean().backward()
            baseline.zero_grad(set_to_none=True)

        results["in-device baseline (no budget)"] = timed_steps(backend, baseline_step, args.steps)
        results["in-device, checkpointed micro-batches (no budget)"] = timed_steps(
            backend, checkpointed_step, args.steps
        )
    except OUT_OF_MEMORY:
        print("the in-device baseline does not fit; compute time is estimated per slice")
    finally:
        baseline = None
        release_memory(backend)  # and the pinned bandwidth buffer, cached by torch

    cap_memory(backend, args, args.budget_gib)

    # Ours first: a peer may run out of memory under the cap, and must not take our
    # figures with it.
    ours = OffloadModel(
        copy.deepcopy(reference),
        num_slices=slices,
        checkpoint_activation=True,
        num_microbatches=micro,
        backend=backend,
    )
    backend.reset_peak_memory_stats()
    retries_before = allocator_retries(backend)
    training["offload.OffloadModel"] = train(backend, ours, x, args.steps)
    peak = backend.max_memory_allocated()
    retries = allocator_retries(backend)
    if retries is not None and retries_before is not None:
        retries -= retries_before
    # One more step, its backward traced at the dispatch level (after the timed ones).
    on_device = None if smoke else device_figures(backend, ours, x)
    del ours
    host_cache = release_memory(backend)

    def left_s() -> float:
        """Seconds left before ``--deadline-s`` (infinite without one)."""
        deadline = getattr(args, "deadline_s", 0.0) or float("inf")
        return deadline - (time.monotonic() - began)

    def out_of_time() -> dict[str, Any]:
        return {
            "result": f"not attempted: past the run's deadline ({args.deadline_s:g} s), "
            "so that the figures already taken are written"
        }

    fsdp2_times, fsdp2 = (
        compare_fsdp2(backend, reference, x, args) if left_s() > 0 else (None, out_of_time())
    )
    if fsdp2_times is not None:
        training["FSDP2 CPUOffloadPolicy"] = fsdp2_times
    print(f"FSDP2 with CPUOffloadPolicy: {fsdp2['result']}")

    fairscale_times, fairscale = (
        compare_fairscale(backend, reference, x, args, slices, micro)
        if left_s() > 0
        else (None, out_of_time())
    )
    if fairscale_times is not None:
        training["fairscale OffloadModel"] = fairscale_times
    print(f"fairscale OffloadModel: {fairscale['result']}")

    deepspeed = compare_deepspeed(backend, args, left_s()) if left_s() > 0 else out_of_time()
    if "forward_backward" in deepspeed:
        training["DeepSpeed ZeRO-3 offload"] = {
            key: deepspeed.pop(key) for key in ("forward_backward", "optimizer")
        }
    print(f"DeepSpeed ZeRO-3 offload: {deepspeed['result']}")

    for name, times in training.items():
        results[name] = times["forward_backward"]
    medians = {name: statistics.median(values) for name, values in results.items()}
    optimizer_medians = {
        name: statistics.median(times["optimizer"]) for name, times in training.items()
    }
    step_time = medians["offload.OffloadModel"]
    plain = medians.get("in-device baseline (no budget)", float("nan"))
    compute = medians.get("in-device, checkpointed micro-batches (no budget)", plain)
    # One copy stream (the code measured on 2026-11-27) serialises both ways; the two
    # slices still resident at the turn are not loaded again.
    slice_bytes = model_bytes / slices
    transfer_one_stream = (2 * model_bytes - 2 * slice_bytes) / h2d + model_bytes / d2h
    overlap_one_stream = max(plain, transfer_one_stream) / step_time
    # Without the in-device baseline (it did not fit) the copies alone bound the step.
    busiest = [t for t in (compute, floor["loads_s"], floor["stores_s"]) if t == t]  # not NaN
    overlap = max(busiest) / step_time
    over_floor = step_time / floor["floor_s"]

    rows = []
    for name, median in medians.items():
        optimizer_s = optimizer_medians.get(name)
        rows.append(
            (
                name,
                f"{median * 1e3:.1f} ms",
                "-" if smoke else f"{median / floor['floor_s']:.2f}x",
                f"{step_time / median:.2f}" if name in training else "-",
                "-" if optimizer_s is None else f"{optimizer_s * 1e3:.1f} ms",
                "-" if optimizer_s is None else f"{(median + optimizer_s) * 1e3:.1f} ms",
            )
        )
    cap_text = (
        "none (a smoke run on the host)"
        if smoke
        else f"{args.budget_gib} GiB ({model_bytes / budget:.1f}x smaller than the model)"
    )
    print(
        f"\nbackend: {backend.name}; model: {blocks} blocks, width {width}, "
        f"{model_bytes / 2**30:.1f} GiB of float32 parameters; device budget {cap_text}; "
        f"{slices} slices, {micro} micro-batches, checkpointed; {tokens} tokens per step; "
        f"peak device memory {peak / 2**30:.2f} GiB; allocator retries during our steps: "
        f"{retries}; host optimizer: SGD, timed apart\n"
    )
    print_table(
        ("variant", "fwd+bwd", "vs copy floor", "ours over it", "optimizer", "full step"),
        rows,
    )
    on_host = host_figures()
    print(
        f"\nnew device tensors of a weight's size or more in backward, on the host with every "
        f"copy forced on (both wrappers, both strategies): {on_host['count']}"
        + ("" if on_device is None else f"; on {backend.name}, ours: {on_device['count']}")
    )

    fsdp2_ratio = _ratio(step_time, medians.get("FSDP2 CPUOffloadPolicy"))
    fairscale_speedup = _ratio(medians.get("fairscale OffloadModel"), step_time)
    reasons: dict[str, str] = {}
    summary: dict[str, Any] = {
        "step_over_floor": None if smoke else over_floor,
        "overlap_efficiency": None if smoke else overlap,
        "allocator_retries": retries,
        "backward_allocations": on_host["count"],
        "backward_allocations_on_device": None if on_device is None else on_device["count"],
        "fsdp2_step_ratio": fsdp2_ratio,
        "fairscale_speedup": fairscale_speedup,
        "device": torch.cuda.get_device_name(device) if cuda else backend.name,
    }
    if smoke:
        for key in ("step_over_floor", "overlap_efficiency"):
            reasons[key] = "No GPU: on the host nothing is copied, so there is no copy floor."
        reasons["backward_allocations_on_device"] = (
            "No GPU: on the host nothing is copied; backward_allocations counts the host "
            "run with every copy forced on."
        )
    if retries is None:
        reasons["allocator_retries"] = (
            f"The {backend.device_type} backend has no allocator retry counter (CUDA's only)."
        )
    if fsdp2_ratio is None:
        reasons["fsdp2_step_ratio"] = f"FSDP2: {fsdp2['result']}."
    if fairscale_speedup is None:
        reasons["fairscale_speedup"] = f"fairscale: {fairscale['result']}."
    summary["reasons"] = reasons

    targets: dict[str, Any] = {}
    if not smoke:
        assert on_device is not None
        targets = device_targets(
            over_floor,
            overlap,
            retries,
            fsdp2_ratio,
            medians,
            step_time,
            fairscale,
            fsdp2,
            on_device,
        )
        print()
        print_table(
            ("measure", "value", "target", "met"),
            [
                ("copy floor (loads, separate copy engines)", f"{floor['floor_s'] * 1e3:.1f} ms",
                 "-", "-"),
                ("compute time (in-device, checkpointed)", f"{compute * 1e3:.1f} ms", "-", "-"),
                *[
                    (
                        name,
                        "-" if t["value"] is None else f"{t['value']:.3f}",
                        t["target"],
                        "NOT PROVEN" if t["met"] is None else ("met" if t["met"] else "missed"),
                    )
                    for name, t in targets.items()
                ],
            ],
        )  # fmt: skip
    return {
        "mode": "smoke (host, tiny model)" if smoke else "device throughput",
        "summary": summary,
        "model": {
            "blocks": blocks,
            "width": width,
            "hidden": hidden,
            "bytes": model_bytes,
            "tokens": tokens,
            "slices": slices,
            "microbatches": micro,
        },
        "budget_bytes": None if smoke else budget,
        "bandwidth_bytes_per_s": {"h2d": h2d, "d2h": d2h},
        "copy_floor": floor,
        "median_step_s": medians,
        "median_optimizer_s": optimizer_medians,
        "host_optimizer": "torch.optim.SGD(lr=1e-6), the same for every wrapper",
        "step_times_s": results,
        "optimizer_times_s": {name: t["optimizer"] for name, t in training.items()},
        "peak_device_bytes": peak,
        "allocator_retries_during_ours": retries,
        "backward_allocations": {"host": on_host, "device": on_device},
        "fsdp2": fsdp2,
        "fairscale": fairscale,
        "deepspeed": deepspeed,
        "host_cache_release": host_cache,
        "transfer_time_s": transfer_one_stream,
        "overlap_efficiency_one_stream": overlap_one_stream,
        "compute_time_s": compute,
        "targets": targets,
    }


def device_targets(
    over_floor: float,
    overlap: float,
    retries: int | None,
    fsdp2_ratio: float | None,
    medians: dict[str, float],
    step_time: float,
    fairscale: dict[str, Any],
    fsdp2: dict[str, Any],
    on_device: dict[str, Any],
) -> dict[str, Any]:
    """Every target of a device run; ``met`` is ``None`` where nothing was measured."""
    targets: dict[str, Any] = {
        "step_over_floor": {
            "value": over_floor,
            "target": f"<= {FLOOR_TARGET}",
            "met": over_floor <= FLOOR_TARGET,
        },
        "overlap_efficiency": {
            "value": overlap,
            "target": OVERLAP_TARGET,
            "met": overlap >= OVERLAP_TARGET,
        },
        "allocator_retries": {
            "value": retries,
            "target": 0,
            "met": None if retries is None else retries == 0,
        },
        "backward_allocations_on_device": {
            "value": on_device["count"],
            "target": 0,
            "met": on_device["count"] == 0,
            "note": f"device tensors of a weight's size or more in backward: {on_device['ops']}",
        },
        "faster_than_fsdp2": {
            "value": fsdp2_ratio,
            "target": "< 1 (ours over FSDP2's forward plus backward)",
            "met": None if fsdp2_ratio is None else fsdp2_ratio < 1,
            # Where FSDP2 ran only under a raised cap, ours had less memory than it did.
            "note": "" if fsdp2["result"].startswith("timed") else f"FSDP2: {fsdp2['result']}",
        },
    }
    if fairscale["result"] != "not installed":
        targets["speedup_vs_fairscale"] = speedup_target(
            medians.get("fairscale OffloadModel"), step_time, fairscale, FAIRSCALE_SPEEDUP_TARGET
        )
    return targets


def compare_fsdp2(
    backend: Accelerator, reference: nn.Sequential, x: torch.Tensor, args: argparse.Namespace
) -> tuple[dict[str, list[float]] | None, dict[str, Any]]:
    """Time FSDP2 with CPU offload under the cap, then a raised cap if it runs out.

    A refusal or running out of memory under every cap is its result.
    """
    from _offload_peers import PIN_REFUSAL, build_fsdp2, first_line, single_process_group

    device = backend.device()
    record: dict[str, Any] = {"units": "one per block, each block checkpointed; the whole batch"}

    def build() -> nn.Module:
        try:
            model = build_fsdp2(reference, device)
            record["pin_memory"] = True
        except RuntimeError as exc:
            if PIN_REFUSAL not in str(exc) or backend.device_type == "cuda":
                raise
            # The host without an accelerator: torch cannot pin. Same code, unpinned.
            record["pinned_refusal"] = first_line(exc)
            model = build_fsdp2(reference, device, pin_memory=False)
            record["pin_memory"] = False
        return model

    def time_steps(model: nn.Module) -> dict[str, list[float]]:
        backend.reset_peak_memory_stats()
        before = allocator_retries(backend)
        times = train(backend, model, x.to(device), args.steps)
        after = allocator_retries(backend)
        record["peak_device_bytes"] = backend.max_memory_allocated()
        if before is not None and after is not None:
            record["allocator_retries"] = after - before
        return times

    try:
        with single_process_group(device.type):
            times, outcome = time_under_caps(
                peer_caps(args),
                build,
                time_steps,
                lambda gib: cap_memory(backend, args, gib),
                lambda: release_memory(backend),
            )
    except Exception as exc:  # a peer's failure is a result, never the run's end
        record["result"] = f"failed: {first_line(exc)}"
        release_memory(backend)
        return None, record
    finally:
        cap_memory(backend, args, args.budget_gib)  # the budget again, for the next peer
    record.update(outcome)
    if times is not None and not record["pin_memory"]:
        record["result"] = record["result"].replace("timed", "timed with unpinned shards")
    return times, record


def compare_deepspeed(
    backend: Accelerator, args: argparse.Namespace, left_s: float = float("inf")
) -> dict[str, Any]:
    """Time DeepSpeed ZeRO-3 with CPU offload in a child process, where it can run at all."""
    from _offload_peers import deepspeed_status, run_deepspeed_child

    why_not = deepspeed_status(backend.device_type)
    if why_not is not None:
        return {"result": why_not}
    options = [
        "--backend", backend.name, "--steps", str(args.steps),
        "--budget-gib", str(args.budget_gib), "--blocks", str(args.blocks),
        "--width", str(args.width), "--tokens", str(args.tokens),
    ]  # fmt: skip
    timeout_s = min(args.deepspeed_timeout_s, left_s)
    record = run_deepspeed_child(Path(__file__), options, timeout_s)
    record.setdefault("timeout_s", timeout_s)
    return record


def deepspeed_peer(backend: Accelerator, args: argparse.Namespace) -> None:
    """The child process of ``compare_deepspeed``: print one JSON line with the times."""
    from _offload_peers import deepspeed_engine

    device = backend.device()
    if backend.device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    x = torch.randn(args.tokens, args.width, generator=torch.Generator().manual_seed(1))
    limit_device_memory(backend, int(args.budget_gib * 2**30))
    record: dict[str, Any] = {}
    before = allocator_retries(backend)
    try:
        engine = deepspeed_engine(
            lambda: make_model(args.blocks, args.width, 4 * args.width), host_optimizer
        )
        inputs = x.to(device)

        def forward_backward() -> None:
            engine.backward(engine(inputs).square().mean())

        times = timed_training(backend, forward_backward, engine.step, args.steps)
        record.update(times)
        record["result"] = "timed"
    except OUT_OF_MEMORY as exc:
        record["result"] = f"out of memory under the {args.budget_gib:g} GiB cap: {exc}"[:300]
    after = allocator_retries(backend)
    record["peak_device_bytes"] = backend.max_memory_allocated()
    if before is not None and after is not None:
        record["allocator_retries"] = after - before
    print(json.dumps(record))


def compare_fairscale(
    backend: Accelerator,
    reference: nn.Module,
    x: torch.Tensor,
    args: argparse.Namespace,
    slices: int,
    micro: int,
) -> tuple[dict[str, list[float]] | None, dict[str, Any]]:
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

    def time_steps(theirs: nn.Module) -> dict[str, list[float]]:
        return train(backend, theirs, x.to(device), args.steps)

    try:
        return time_under_caps(
            peer_caps(args),
            build,
            time_steps,
            lambda gib: cap_memory(backend, args, gib),
            lambda: release_memory(backend),
        )
    except TypeError as exc:
        # fairscale 0.4.13's OffloadModel refuses every device but CUDA with a TypeError.
        if "CUDA must be available" not in str(exc):
            raise
        return None, {"result": f"not run on {device}: {exc}"}


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
