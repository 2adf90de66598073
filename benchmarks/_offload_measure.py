"""The model bench_offload.py trains, and how one of its runs is measured.

* the model: ``blocks`` MLP blocks (``Linear``, ``GELU``, ``Linear``), seeded;
* the device: pinned bandwidth each way, a memory cap (the vendor's per-process memory
  fraction: :func:`limit_device_memory`), the allocator's retries;
* the clock: steps timed with the device synchronised on both sides, forward plus
  backward timed apart from the host optimizer's step (:func:`train`), and the copy
  floor those figures are judged against (:func:`copy_floor`).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterable

import torch
from torch import nn

from accel import Accelerator


def block(width: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))


def make_model(blocks: int, width: int, hidden: int, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(*[block(width, hidden) for _ in range(blocks)])


def parameter_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


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
