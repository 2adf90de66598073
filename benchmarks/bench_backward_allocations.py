"""Device tensors offload allocates during backward, counted at the dispatch level.

The tracer is the tests' (``tests/offload/_offload_allocations.py``): every operator
output on memory none of its inputs held is a new tensor. What counts is a new device
tensor as large as the smallest weight matrix or larger; the tracer also keeps the peak
of the device bytes allocated during backward and still alive (the measure of a device
without memory counters).

* :func:`host_figures`: on the host, with every copy forced on, both wrappers
  (``OffloadModel`` checkpointed in several slices and micro-batches, and
  ``offload_parameters``) under both strategies (``swap-data``, ``copy-parameters``),
  the third step's backward (the first steps fill the wrappers' pools and learn what to
  prefetch). Host memory handed out as gradients is page-locked memory, left out.
* :func:`native_figures`: on a device, both wrappers with the strategy the device takes,
  six ``Linear(1024, 1024)`` layers and two rows of activations, every step's backward.
* :func:`device_figures`: one more step of a model already trained on a device, traced
  there (what ``bench_offload.py`` adds to a GPU run beside its timings).

Usage: python benchmarks/bench_backward_allocations.py [--backend NAME] [--label TEXT]
(the host figures on ``cpu``, the native ones elsewhere; JSON to ``results/``).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from _report import write_results
from torch import nn

import accel
from accel import Accelerator
from offload import OffloadModel, offload_parameters
from offload._core import strategy as offload_strategy
from offload._core import transfer as offload_transfer

STEPS = 3


def _tracer() -> ModuleType:
    """The tests' tracer module (loaded from its file once; the tests load it the same way)."""
    name = "_offload_allocations"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "tests" / "offload" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def smallest_weight_bytes(model: nn.Module) -> int:
    """Bytes of the smallest weight matrix: the size from which an allocation counts."""
    return min(p.numel() * p.element_size() for p in model.parameters() if p.dim() == 2)


def traced_step(
    backend: Accelerator, model: nn.Module, x: torch.Tensor, weight_bytes: int
) -> dict[str, Any]:
    """Run one step of ``model`` on ``x``, its backward traced; the new large tensors."""
    loss = model(x).square().mean()
    with _tracer().Allocations(backend.device_type) as tracer:
        loss.backward()
    backend.synchronize()
    model.zero_grad(set_to_none=True)
    found = tracer.at_least(weight_bytes)
    return {
        "count": len(found),
        "bytes": sum(record.nbytes for record in found),
        "ops": sorted({record.op for record in found}),
        "peak_live_device_bytes": tracer.peak_live_bytes,
        "smallest_weight_bytes": weight_bytes,
    }


def _layers(blocks: int, width: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        *[nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
          for _ in range(blocks)]
    )  # fmt: skip


def host_figures(blocks: int = 6, width: int = 64, rows: int = 8) -> dict[str, Any]:
    """Allocations in backward on the host, per wrapper and strategy (every copy forced on)."""
    forced = offload_transfer.copies_needed, offload_strategy.choose
    backend = _tracer().HostMarkingCpu()
    x = torch.randn(rows, width, generator=torch.Generator().manual_seed(1))
    results: dict[str, Any] = {}
    try:
        offload_transfer.copies_needed = lambda device, home: True  # type: ignore[assignment]
        for name in (offload_strategy.SWAP_DATA, offload_strategy.COPY_PARAMETERS):
            offload_strategy.choose = lambda device, home=None, name=name: name  # type: ignore[assignment]
            wrappers: dict[str, Callable[[], nn.Module]] = {
                "OffloadModel(num_slices=3, checkpoint_activation=True, num_microbatches=2)": (
                    lambda: OffloadModel(
                        _layers(blocks, width),
                        num_slices=3,
                        checkpoint_activation=True,
                        num_microbatches=2,
                        backend=backend,
                    )
                ),
                "offload_parameters(model)": lambda: _parameter_offload(
                    _layers(blocks, width), backend
                ),
            }
            for label, build in wrappers.items():
                model = build()
                weight_bytes = smallest_weight_bytes(model)
                for _ in range(STEPS - 1):
                    model(x).square().mean().backward()
                    model.zero_grad(set_to_none=True)
                results[f"{label} [{name}]"] = traced_step(backend, model, x, weight_bytes)
    finally:
        offload_transfer.copies_needed, offload_strategy.choose = forced  # type: ignore[assignment]
    return {
        "model": {"blocks": blocks, "width": width, "rows": rows, "step_traced": STEPS},
        "wrappers": results,
        "count": sum(figures["count"] for figures in results.values()),
    }


def _parameter_offload(model: nn.Module, backend: Accelerator) -> nn.Module:
    offload_parameters(model, backend=backend)
    return model


def native_figures(backend: Accelerator, steps: int = 3) -> dict[str, Any]:
    """Allocations in each step's backward on ``backend``, with its own strategy."""

    def layers() -> nn.Sequential:
        torch.manual_seed(0)
        return nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(6)])

    wrappers: dict[str, Callable[[], nn.Module]] = {
        "OffloadModel(num_slices=3, checkpoint_activation=True)": lambda: OffloadModel(
            layers(), num_slices=3, checkpoint_activation=True, backend=backend
        ),
        "offload_parameters(model)": lambda: _parameter_offload(layers(), backend),
    }
    x = torch.randn(2, 1024, generator=torch.Generator().manual_seed(1)).to(backend.device())
    results: dict[str, Any] = {}
    for label, build in wrappers.items():
        model = build()
        weight_bytes = smallest_weight_bytes(model)
        results[label] = [traced_step(backend, model, x, weight_bytes) for _ in range(steps)]
    return {
        "strategy": offload_strategy.choose(backend.device()),
        "model": {"layers": "6 x Linear(1024, 1024)", "rows": 2},
        "steps": results,
    }


def device_figures(backend: Accelerator, model: nn.Module, x: torch.Tensor) -> dict[str, Any]:
    """One more step of ``model`` (already trained on ``backend``), its backward traced."""
    return traced_step(backend, model, x, smallest_weight_bytes(model))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backend", default="cpu", help="backend name (default: cpu)")
    parser.add_argument("--label", default="", help="a note on the code measured, kept")
    parser.add_argument("--results-dir", type=Path, default=None, help="default: results/")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    backend = accel.get_backend(args.backend)
    if backend.device_type == "cpu":
        payload = {"mode": "host, every copy forced on", **host_figures()}
        print(f"new device tensors of a weight's size or more, third backward: {payload['count']}")
        for label, figures in payload["wrappers"].items():
            print(f"  {label}: {figures['count']} {figures['ops']}")
    else:
        payload = {"mode": f"{backend.name}, its own strategy", **native_figures(backend)}
        for label, steps in payload["steps"].items():
            counts = [(s["count"], s["peak_live_device_bytes"]) for s in steps]
            print(f"{label}: per step (count, peak live device bytes in backward) {counts}")
    if args.label:
        payload["label"] = args.label
    name = "backward-allocations" + (f"-{args.label.split()[0]}" if args.label else "")
    path = write_results(name, backend.name, payload, args.results_dir)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
