"""Device rates measured on the device, cached, and the default the planner takes.

The planner itself never times anything (:mod:`._cost`). :func:`calibrate_rates` is
the one place that does, and only when asked: it times small matrix products,
convolutions, attention, pointwise operators, random draws, an operator call's fixed
cost, a selective policy's cost per call and a saved-tensor hook's, on the device,
and returns them as :class:`DeviceRates`; with ``model`` and ``example_inputs`` it also
times the pointwise and normalisation operators that model's step calls, at their
shapes, for per-operator rates. ``save=True`` caches them for the device
(:func:`rates_cache_path`), where :func:`default_rates` and so every later planning on
that machine finds them. Calibrated rates change estimates and so plans; they are
recorded in every plan made with them, so a plan can be reproduced from its file.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from accel import Accelerator

from .._checkpoint import run_checkpoint
from .._non_reentrant import ContextFn
from .._selective import kept_calls_context_fn
from ._cost import DeviceRates, builtin_rates

__all__ = ["calibrate_rates", "default_rates", "rates_cache_path"]

_ROUNDS = 7


def _seconds(step: Callable[[], Any], backend: Accelerator, rounds: int = _ROUNDS) -> float:
    """The median seconds of ``step`` over ``rounds`` runs after one warm-up."""
    step()
    backend.synchronize()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        step()
        backend.synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


class _Chain(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(_LAYERS):
            hidden = torch.nn.functional.gelu(self.linear(self.norm(x)))
            hidden = torch.nn.functional.dropout(hidden, 0.1, training=True)
            x = x + hidden.reshape(2, 2, 8).transpose(0, 1).reshape(4, 8)
        return x


class _Counter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.calls.append(str(func))
        return func(*args, **(kwargs or {}))


def _best_times(steps: list[Callable[[], Any]], backend: Accelerator) -> list[float]:
    """Each step's median seconds, the steps interleaved round by round."""
    for step in steps:
        step()
    backend.synchronize()
    samples: list[list[float]] = [[] for _ in steps]
    for _ in range(_ROUNDS):
        for times, step in zip(samples, steps, strict=True):
            start = time.perf_counter()
            step()
            backend.synchronize()
            times.append(time.perf_counter() - start)
    return [statistics.median(times) for times in samples]


def selective_overhead(backend: Accelerator) -> tuple[float, float]:
    """Seconds per operator call, and extra seconds per kept call, of a selective policy.

    Args:
        backend: The backend the model runs on; its generators are left as they were.

    Returns:
        ``(per_call, per_kept_call)``, both at least 0.
    """
    with backend.fork_rng():
        chain = _Chain().to(backend.device())
        x = torch.ones(4, 8, device=backend.device(), requires_grad=True)
        counter = _Counter()
        with counter:
            chain(x)
        seen: dict[str, int] = {}
        every = []
        for name in counter.calls:
            every.append((name, seen.get(name, 0)))
            seen[name] = seen.get(name, 0) + 1
        calls = len(every)

        def run(context_fn: ContextFn | None, checkpointed: bool = True) -> None:
            if checkpointed:
                out = run_checkpoint(
                    chain, (x,), {}, use_reentrant=False, backend=backend, context_fn=context_fn
                )
            else:
                out = chain(x)
            out.sum().backward()

        keep_none, keep_all = kept_calls_context_fn(()), kept_calls_context_fn(every)
        run(keep_all)  # warm-up: first calls build caches
        plain, full, none, kept = _best_times(
            [
                lambda: run(None, checkpointed=False),
                lambda: run(None),
                lambda: run(keep_none),
                lambda: run(keep_all),
            ],
            backend,
        )
    per_call = max(none - full, 0.0) / calls
    per_kept = max((kept - plain) / calls - per_call, 0.0)
    return per_call, per_kept


def rates_cache_path(backend: Accelerator) -> Path:
    """Where calibrated rates for ``backend``'s device are cached.

    ``$ACCEL_CACHE_DIR`` (default ``~/.cache/accel``), then
    ``rates-<device type>-<device name>-torch<version>.json``.
    """
    root = Path(os.environ.get("ACCEL_CACHE_DIR") or Path.home() / ".cache" / "accel")
    name = "".join(c if c.isalnum() else "-" for c in _device_name(backend)).strip("-")
    version = torch.__version__.split("+")[0]
    return root / f"rates-{backend.device_type}-{name}-torch{version}.json"


def _device_name(backend: Accelerator) -> str:
    try:
        return str(backend.device_name())
    except Exception:
        return backend.name


def default_rates(backend: Accelerator) -> DeviceRates:
    """The rates the planner takes by default: cached for this device, else built-in.

    Args:
        backend: The backend the model runs on.

    Returns:
        The rates :func:`calibrate_rates` cached for this device, where a cache file
        exists and reads back, else :func:`builtin_rates` for its device type.
    """
    path = rates_cache_path(backend)
    if path.is_file():
        try:
            return DeviceRates.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except (ValueError, TypeError, KeyError):
            pass  # a damaged or older cache: the built-in rates, as without one
    return builtin_rates(backend.device_type)


def calibrate_rates(backend: Accelerator | str | None = None, *, save: bool = False) -> DeviceRates:
    """Measure the cost model's rates on ``backend``'s device (see the module docstring).

    Args:
        backend: The backend or its name; ``None`` means :func:`accel.get_backend`.
        save: Cache the rates for this device, where :func:`default_rates` finds them.

    Returns:
        The measured rates (``source`` says when and where).
    """
    import accel

    resolved = accel.get_backend(backend) if not hasattr(backend, "device_type") else backend
    assert resolved is not None
    rates = _measure(resolved)  # type: ignore[arg-type]
    if save:
        path = rates_cache_path(resolved)  # type: ignore[arg-type]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(rates.to_dict(), indent=1) + "\n", encoding="utf-8")
    return rates


def _measure(backend: Accelerator) -> DeviceRates:
    device = backend.device()
    base = builtin_rates(backend.device_type)
    with backend.fork_rng(), torch.no_grad():
        a = torch.randn(512, 512, device=device)
        matmul = 2 * 512**3 / _seconds(lambda: a @ a, backend)
        image = torch.randn(8, 64, 32, 32, device=device)
        weight = torch.randn(64, 64, 3, 3, device=device)
        flops = 2 * 8 * 64 * 64 * 9 * 32 * 32
        convolution = flops / _seconds(
            lambda: torch.nn.functional.conv2d(image, weight, padding=1), backend
        )
        q = torch.randn(4, 8, 256, 64, device=device)
        attention_flops = 4 * 4 * 8 * 256 * 256 * 64
        attention = attention_flops / _seconds(
            lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q), backend
        )
        x = torch.randn(1 << 21, device=device)
        memory = 3 * x.numel() * 4 / _seconds(lambda: x + x, backend)
        random = x.numel() * 4 / _seconds(lambda: torch.empty_like(x).bernoulli_(0.9), backend)
        tiny = torch.ones(4, device=device)
        call = _seconds(lambda: [tiny + tiny for _ in range(100)], backend) / 100
        operators = _operator_rates(x, backend)
    per_call, per_kept = selective_overhead(backend)
    hook = _hook_seconds(backend)
    where = f"calibrated on {_device_name(backend)}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}"
    return replace(
        base,
        source=where,
        matmul_flops=matmul,
        attention_flops=attention,
        convolution_flops=convolution,
        memory_bytes=memory,
        random_bytes=random,
        call_seconds=call,
        policy_call_seconds=per_call,
        policy_kept_seconds=per_kept,
        hook_seconds=hook,
        operator_bytes=operators,
    )


def _operator_rates(x: torch.Tensor, backend: Accelerator) -> dict[str, float]:
    """Bytes per second of the operators one memory rate misjudges most."""
    rows = x.view(-1, 1024)
    functional = torch.nn.functional
    weight = torch.ones(1024, device=x.device)
    steps: dict[str, Callable[[], Any]] = {
        "aten.gelu.default": lambda: functional.gelu(x),
        "aten.silu.default": lambda: functional.silu(x),
        "aten.tanh.default": lambda: torch.tanh(x),
        "aten.sigmoid.default": lambda: torch.sigmoid(x),
        "aten.exp.default": lambda: torch.exp(x),
        "aten.native_layer_norm.default": lambda: functional.layer_norm(rows, (1024,), weight),
        "aten._softmax.default": lambda: torch.softmax(rows, -1),
    }
    moved = 2 * x.numel() * x.element_size()
    return {name: moved / _seconds(step, backend) for name, step in steps.items()}


def _hook_seconds(backend: Accelerator) -> float:
    """What a pair of saved-tensor hooks adds per saved tensor."""
    x = torch.ones(4, 8, device=backend.device(), requires_grad=True)

    def step() -> None:
        y = x
        for _ in range(50):
            y = y * 1.0001
        y.sum().backward()

    plain = _seconds(step, backend)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        hooked = _seconds(step, backend)
    return max(hooked - plain, 0.0) / 50
