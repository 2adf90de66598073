"""Device rates measured on the device, cached, and the default the planner takes.

The planner itself never times anything (:mod:`._cost`). :func:`calibrate_rates` is
the one place that does, and only when asked: it times a matrix product, a
convolution, attention, a pointwise operator, a random draw, an operator call's fixed
cost, a selective policy's cost per call and a saved-tensor hook's, on the device, and
returns them as :class:`DeviceRates`. With ``model`` and ``example_inputs`` it also
records the operator calls of one training step of that model on fake tensors
(forward and backward, as the planner's profile does), and times each pointwise,
normalisation, reduction and copy operator among them at its most common shapes and
dtypes, on real random tensors, for per-operator byte rates. ``save=True`` caches the
rates for the device (:func:`rates_cache_path`), where :func:`default_rates` and so
every later planning on that machine finds them. Calibrated rates change estimates
and so plans; they are recorded in every plan made with them, so a plan can be
reproduced from its file.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import accel
from accel import Accelerator

from .._args import require_bool, resolve_backend
from .._checkpoint import run_checkpoint
from .._non_reentrant import ContextFn
from .._selective import kept_calls_context_fn, unavailable_reason
from . import _stopwatch
from ._cost import DeviceRates, builtin_rates, tensor_bytes
from ._operator_rates import model_operator_rates, record_calls
from ._stopwatch import SIZES, Sizes, best_times, seconds

__all__ = ["calibrate_rates", "default_rates", "rates_cache_path", "selective_overhead"]


_LAYERS = 4  # layers of the chain selective_overhead times


class _Chain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(_LAYERS):
            hidden = nn.functional.gelu(self.linear(self.norm(x)))
            hidden = nn.functional.dropout(hidden, 0.1, training=True)
            x = x + hidden.reshape(2, 2, 8).transpose(0, 1).reshape(4, 8)
        return x


class _Reference(nn.Module):
    """A step with the pointwise and normalisation operators common models call.

    A transformer-like part (layer norm, GELU, SiLU, softmax, tanh, sigmoid, dropout,
    residual adds) on ``(4, 32, width)`` and a convolutional part (batch norm, ReLU,
    mean) on ``(4, 16, 12, 12)``: its operators, forward and backward, at these shapes
    give :func:`calibrate_rates` its per-operator rates where no model is given.
    """

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.linear = nn.Linear(width, width)
        self.conv = nn.Conv2d(16, 16, 3, padding=1)
        self.batch_norm = nn.BatchNorm2d(16)

    def forward(self, x: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        functional = nn.functional
        hidden = functional.gelu(self.linear(self.norm(x)))
        hidden = functional.dropout(hidden, 0.1, training=True)
        x = x + functional.silu(hidden) * torch.sigmoid(hidden)
        x = x + torch.tanh(x) + torch.softmax(x, dim=-1)
        features = functional.relu(self.batch_norm(self.conv(image)))
        return x.sum() + features.mean(dim=(2, 3)).sum()


class _Counter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.calls.append(str(func))
        return func(*args, **(kwargs or {}))


def selective_overhead(backend: Accelerator, sizes: Sizes = SIZES) -> tuple[float, float]:
    """Seconds per operator call, and extra seconds per kept call, of a selective policy.

    Args:
        backend: The backend the model runs on; its generators are left as they were.
        sizes: How many rounds to time.

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
        plain, full, none, kept = best_times(
            [
                lambda: run(None, checkpointed=False),
                lambda: run(None),
                lambda: run(keep_none),
                lambda: run(keep_all),
            ],
            backend,
            sizes,
        )
    per_call = max(none - full, 0.0) / calls
    per_kept = max((kept - plain) / calls - per_call, 0.0)
    return per_call, per_kept


def rates_cache_path(backend: Accelerator) -> Path:
    """Where calibrated rates for ``backend``'s device are cached.

    ``$ACCEL_CACHE_DIR`` (default ``~/.cache/accel``), then
    ``rates-<device type>-<device name>-torch<version>.json``.

    Args:
        backend: The backend whose device the rates describe.

    Returns:
        The cache file's path (it need not exist).
    """
    root = Path(os.environ.get("ACCEL_CACHE_DIR") or Path.home() / ".cache" / "accel")
    name = "".join(c if c.isalnum() else " " for c in _device_name(backend))
    name = "-".join(name.split())
    version = torch.__version__.split("+")[0]
    return root / f"rates-{backend.device_type}-{name}-torch{version}.json"


def _device_name(backend: Accelerator) -> str:
    """The device's model name (a host's processor and its intra-op threads), else the backend's."""
    if backend.device_type == "cpu":
        model = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as info:
                names = [line.split(":", 1)[1] for line in info if line.startswith("model name")]
            model = names[0].strip() if names else model
        except OSError:
            pass  # not Linux: the platform's name
        return f"{model}, {torch.get_num_threads()} threads"
    module = getattr(torch, backend.device_type, None)
    try:
        return str(module.get_device_name())  # type: ignore[union-attr]
    except Exception:  # a device module without names: the backend's
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
            values = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(values, dict) and values.get("device_type") == backend.device_type:
                return DeviceRates.from_dict(values)
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            pass  # a damaged or older cache: the built-in rates, as without one
    return builtin_rates(backend.device_type)


def calibrate_rates(
    backend: Accelerator | str | None = None,
    *,
    model: nn.Module | None = None,
    example_inputs: Any = None,
    save: bool = False,
) -> DeviceRates:
    """Measure the cost model's rates on ``backend``'s device (see the module docstring).

    Nothing here runs unless called: planning never calibrates. The model's
    parameters, buffers and gradients, and every random generator, are left as they
    were (the model's step runs on fake tensors; the timed operators on new tensors).

    Args:
        backend: The backend or its name; ``None`` means :func:`accel.get_backend`.
        model: A model in training mode whose step's pointwise, normalisation,
            reduction and copy operators get byte rates of their own, timed at their
            most common shapes and dtypes in that step.
        example_inputs: The model's example inputs (a tuple of positional arguments or
            a dict of keyword arguments), given with ``model`` and only with it.
        save: Cache the rates for this device, where :func:`default_rates` finds them.

    Returns:
        The measured rates (``source`` says when and where).

    Raises:
        TypeError: If ``backend`` is not a backend or a name, ``model`` is not a
            module, ``example_inputs`` is not a tuple, list or dict, or ``save`` is
            not a bool.
        ValueError: If only one of ``model`` and ``example_inputs`` is given, the model
            is in evaluation mode, or no output of its step requires grad.
        RuntimeError: If the model's step cannot run on fake tensors.
    """
    require_bool(save, "save")
    _check_model(model, example_inputs)
    resolved = resolve_backend(backend)
    device_backend = accel.get_backend() if resolved is None else resolved
    sizes = _stopwatch.SIZES
    calls = None
    if model is not None:  # first, so that a model that cannot be recorded fails fast
        with device_backend.fork_rng():
            calls = record_calls(model, example_inputs)
    rates = _measure(device_backend, sizes)
    if calls is not None:
        operators = model_operator_rates(calls, device_backend, rates.call_seconds, sizes)
        rates = replace(rates, operator_bytes={**rates.operator_bytes, **operators})
    if save:
        path = rates_cache_path(device_backend)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(rates.to_dict(), indent=1) + "\n", encoding="utf-8")
    return rates


def _check_model(model: Any, example_inputs: Any) -> None:
    if model is None and example_inputs is None:
        return
    if model is None or example_inputs is None:
        given, missing = (
            ("model", "example_inputs") if model is not None else ("example_inputs", "model")
        )
        raise ValueError(
            f"checkpointing: calibrate_rates was given {given} without {missing}; the "
            "operators of a model's step are timed at the shapes its inputs give. Pass "
            "both (model=model, example_inputs=(x,)), or neither for the rates without "
            "per-operator ones."
        )
    if not isinstance(model, nn.Module):
        raise TypeError(
            "checkpointing: calibrate_rates' model must be a torch.nn.Module, got "
            f"{type(model).__name__}. Pass the model whose step's operators to time."
        )
    if not isinstance(example_inputs, tuple | list | dict):
        raise TypeError(
            "checkpointing: calibrate_rates' example_inputs must be a tuple of the model's "
            f"positional arguments (or a dict of keyword arguments), got a "
            f"{type(example_inputs).__name__}. For a model called as model(x), pass "
            "example_inputs=(x,)."
        )
    if not model.training:
        raise ValueError(
            "checkpointing: calibrate_rates' model is in evaluation mode, whose step "
            "skips dropout and uses batch norm's running statistics, so its operators "
            "are not a training step's. Call model.train() first."
        )


def _measure(backend: Accelerator, sizes: Sizes) -> DeviceRates:
    device = backend.device()
    base = builtin_rates(backend.device_type)
    with backend.fork_rng(), torch.no_grad():
        side = sizes.matmul
        a = torch.randn(side, side, device=device)
        matmul = 2 * side**3 / seconds(lambda: a @ a, backend, sizes)
        image = torch.randn(8, 64, sizes.image, sizes.image, device=device)
        weight = torch.randn(64, 64, 3, 3, device=device)
        flops = 2 * 8 * 64 * 64 * 9 * sizes.image**2
        convolution = flops / seconds(
            lambda: nn.functional.conv2d(image, weight, padding=1), backend, sizes
        )
        q = torch.randn(4, 8, sizes.sequence, 64, device=device)
        attention_flops = 4 * 4 * 8 * sizes.sequence**2 * 64
        attention = attention_flops / seconds(
            lambda: nn.functional.scaled_dot_product_attention(q, q, q), backend, sizes
        )
        x = torch.randn(sizes.elements, device=device)
        memory = 3 * tensor_bytes(x) / seconds(lambda: x + x, backend, sizes)
        random = tensor_bytes(x) / seconds(
            lambda: torch.empty_like(x).bernoulli_(0.9), backend, sizes
        )
        tiny = torch.ones(4, device=device)
        call = seconds(lambda: [tiny + tiny for _ in range(100)], backend, sizes) / 100
        reference = _Reference(sizes.width).to(device)
        inputs = (
            torch.randn(4, 32, sizes.width, device=device),
            torch.randn(4, 16, 12, 12, device=device),
        )
    calls = record_calls(reference, inputs)
    operators = model_operator_rates(calls, backend, call, sizes)
    # Without the operator grain (torch 2.4) no plan pays a selective policy: the base
    # rates' figures stay.
    per_call, per_kept = (
        (base.policy_call_seconds, base.policy_kept_seconds)
        if unavailable_reason() is not None
        else selective_overhead(backend, sizes)
    )
    hook = _hook_seconds(backend, sizes)
    where = (
        f"calibrated on {_device_name(backend)}, torch {torch.__version__}, "
        f"{time.strftime('%Y-%m-%d')}"
    )
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


def _hook_seconds(backend: Accelerator, sizes: Sizes) -> float:
    """What a pair of saved-tensor hooks adds per saved tensor."""
    x = torch.ones(4, 8, device=backend.device(), requires_grad=True)

    def step() -> None:
        y = x
        for _ in range(50):
            y = y * 1.0001
        y.sum().backward()

    plain = seconds(step, backend, sizes)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        hooked = seconds(step, backend, sizes)
    return max(hooked - plain, 0.0) / 50
