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
import math
import os
import platform
import statistics
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

import accel
from accel import Accelerator

from .._args import require_bool, resolve_backend
from .._checkpoint import run_checkpoint
from .._non_reentrant import ContextFn
from .._replay import storage_key
from .._selective import kept_calls_context_fn
from .._steps import require_grad, tensors_of
from ._cost import _CONVOLUTION, _MATMUL, _RNN_LAYERS, DeviceRates, builtin_rates, tensor_bytes

__all__ = ["calibrate_rates", "default_rates", "rates_cache_path", "selective_overhead"]


@dataclass(frozen=True)
class _Sizes:
    """How much work each measurement does (smaller for the tests)."""

    rounds: int = 7  # timed samples per measurement; the median is taken
    matmul: int = 512  # side of the square matrix product
    image: int = 32  # side of the convolution's 8 x 64-channel images
    sequence: int = 256  # attention's sequence length (4 x 8 heads of 64)
    elements: int = 1 << 21  # elements of the pointwise operator's and random draw's tensor
    shapes: int = 3  # a model's most common shapes timed per operator
    sample_seconds: float = 2e-3  # repeat a short call within one sample to this length
    width: int = 256  # features of the reference step's transformer-like part
    short_call: float = 2.0  # calls under this many fixed costs get no say in a rate


_SIZES = _Sizes()
_LAYERS = 4  # layers of the chain selective_overhead times


def _seconds(step: Callable[[], Any], backend: Accelerator, sizes: _Sizes) -> float:
    """The median seconds of one ``step`` call, after a warm-up.

    A call shorter than ``sizes.sample_seconds`` is repeated within each sample, so
    that the timer's resolution and the loop around it do not count.
    """
    start = time.perf_counter()
    step()
    backend.synchronize()
    first = time.perf_counter() - start
    repeats = max(1, min(100, math.ceil(sizes.sample_seconds / max(first, 1e-7))))
    samples = []
    for _ in range(sizes.rounds):
        start = time.perf_counter()
        for _ in range(repeats):
            step()
        backend.synchronize()
        samples.append((time.perf_counter() - start) / repeats)
    return statistics.median(samples)


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


def _best_times(steps: list[Callable[[], Any]], backend: Accelerator, sizes: _Sizes) -> list[float]:
    """Each step's median seconds, the steps interleaved round by round."""
    for step in steps:
        step()
    backend.synchronize()
    samples: list[list[float]] = [[] for _ in steps]
    for _ in range(sizes.rounds):
        for times, step in zip(samples, steps, strict=True):
            start = time.perf_counter()
            step()
            backend.synchronize()
            times.append(time.perf_counter() - start)
    return [statistics.median(times) for times in samples]


def selective_overhead(backend: Accelerator, sizes: _Sizes = _SIZES) -> tuple[float, float]:
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
        plain, full, none, kept = _best_times(
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
    sizes = _SIZES
    calls = None
    if model is not None:  # first, so that a model that cannot be recorded fails fast
        with device_backend.fork_rng():
            calls = _record_calls(model, example_inputs)
    rates = _measure(device_backend, sizes)
    if calls is not None:
        operators = _model_operator_rates(calls, device_backend, rates.call_seconds, sizes)
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


def _measure(backend: Accelerator, sizes: _Sizes) -> DeviceRates:
    device = backend.device()
    base = builtin_rates(backend.device_type)
    with backend.fork_rng(), torch.no_grad():
        side = sizes.matmul
        a = torch.randn(side, side, device=device)
        matmul = 2 * side**3 / _seconds(lambda: a @ a, backend, sizes)
        image = torch.randn(8, 64, sizes.image, sizes.image, device=device)
        weight = torch.randn(64, 64, 3, 3, device=device)
        flops = 2 * 8 * 64 * 64 * 9 * sizes.image**2
        convolution = flops / _seconds(
            lambda: nn.functional.conv2d(image, weight, padding=1), backend, sizes
        )
        q = torch.randn(4, 8, sizes.sequence, 64, device=device)
        attention_flops = 4 * 4 * 8 * sizes.sequence**2 * 64
        attention = attention_flops / _seconds(
            lambda: nn.functional.scaled_dot_product_attention(q, q, q), backend, sizes
        )
        x = torch.randn(sizes.elements, device=device)
        memory = 3 * tensor_bytes(x) / _seconds(lambda: x + x, backend, sizes)
        random = tensor_bytes(x) / _seconds(
            lambda: torch.empty_like(x).bernoulli_(0.9), backend, sizes
        )
        tiny = torch.ones(4, device=device)
        call = _seconds(lambda: [tiny + tiny for _ in range(100)], backend, sizes) / 100
        reference = _Reference(sizes.width).to(device)
        inputs = (
            torch.randn(4, 32, sizes.width, device=device),
            torch.randn(4, 16, 12, 12, device=device),
        )
    calls = _record_calls(reference, inputs)
    operators = _model_operator_rates(calls, backend, call, sizes)
    per_call, per_kept = selective_overhead(backend, sizes)
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


def _hook_seconds(backend: Accelerator, sizes: _Sizes) -> float:
    """What a pair of saved-tensor hooks adds per saved tensor."""
    x = torch.ones(4, 8, device=backend.device(), requires_grad=True)

    def step() -> None:
        y = x
        for _ in range(50):
            y = y * 1.0001
        y.sum().backward()

    plain = _seconds(step, backend, sizes)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        hooked = _seconds(step, backend, sizes)
    return max(hooked - plain, 0.0) / 50


@dataclass(frozen=True)
class _Spec:
    """A tensor argument's shape, strides and dtype: what a real one is made from."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class _Call:
    """One recorded operator call: the operator, its arguments as specs, bytes moved."""

    func: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    moved: int  # inputs + new storages, as operator_cost counts them

    def key(self) -> str:
        """The call's shapes, dtypes and other arguments, to group equal calls."""
        return repr((self.args, sorted(self.kwargs.items())))


def _spec(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return _Spec(tuple(value.shape), tuple(value.stride()), value.dtype)
    if isinstance(value, torch.Generator):
        return None
    return value


# Operators given opaque buffers (an RNN layer's workspace, a fused kernel's reserve)
# read them as pointers and offsets: on random values they may crash the process.
_OPAQUE = ("rnn", "lstm", "gru", "cudnn", "mkldnn", "miopen", "_thnn", "_fused", "_foreach")


def _safe_to_time(func: Any) -> bool:
    """Whether ``func`` may be called on random values: an aten operator, not an opaque one.

    Operators of other namespaces (a library's custom operators) may have effects
    beyond their outputs, so they are never called.
    """
    short = func._overloadpacket.__name__
    return bool(func.namespace == "aten") and not any(part in short for part in _OPAQUE)


class _Recorder(TorchDispatchMode):
    """Records the operator calls that :func:`operator_cost` prices by bytes per second."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[_Call] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        short = func._overloadpacket.__name__
        if (
            short in _MATMUL
            or short in _CONVOLUTION
            or short in _RNN_LAYERS
            or "attention" in short
            or torch.Tag.nondeterministic_seeded in func.tags  # priced by random_bytes
            or not _safe_to_time(func)
        ):
            return out
        arguments = tensors_of((args, kwargs))
        inputs = {storage_key(t) for t in arguments}
        fresh = {storage_key(t): t for t in tensors_of(out) if storage_key(t) not in inputs}
        fresh_bytes = sum(t.untyped_storage().nbytes() for t in fresh.values())
        mutates = any(
            arg.alias_info is not None and arg.alias_info.is_write for arg in func._schema.arguments
        )
        if fresh_bytes == 0 and not mutates:
            return out  # a view or a metadata query: priced per call only
        moved = sum(tensor_bytes(t) for t in arguments) + fresh_bytes
        if moved > 0:
            self.calls.append(_Call(func, tree_map(_spec, args), tree_map(_spec, kwargs), moved))
        return out


def _record_calls(model: nn.Module, example_inputs: Any) -> list[_Call]:
    """The priced-by-bytes operator calls of one step of ``model``, run on fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ._profile import _call, _fake_state

    mode = FakeTensorMode(allow_non_fake_inputs=False)
    recorder = _Recorder()
    try:
        with mode:
            state = _fake_state(model, mode)
            inputs = tree_map(
                lambda t: mode.from_tensor(t) if isinstance(t, torch.Tensor) else t,
                example_inputs,
            )
        with ExitStack() as stack:
            stack.enter_context(mode)
            stack.enter_context(recorder)
            output = _call(model, state, inputs)
            outputs = require_grad(output)
            torch.autograd.backward(outputs, [torch.ones_like(t) for t in outputs])
    except ValueError:
        raise
    except Exception as error:  # reported with what to do instead
        raise RuntimeError(
            "checkpointing: calibrate_rates could not run the model's step on fake tensors "
            f"({type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}). "
            "Calibrate without model= (the per-operator rates then are the built-in ones)."
        ) from error
    return recorder.calls


def _real(spec: _Spec, device: torch.device) -> torch.Tensor:
    """A real tensor of ``spec``'s shape, strides and dtype, with valid random values."""
    span = 1 + sum(
        (size - 1) * stride for size, stride in zip(spec.shape, spec.stride, strict=True)
    )
    if any(size == 0 for size in spec.shape):
        span = 0
    if spec.dtype.is_floating_point or spec.dtype.is_complex:
        storage = torch.randn(span, device=device).to(spec.dtype)
    elif spec.dtype == torch.bool:
        storage = torch.rand(span, device=device) < 0.5
    else:
        storage = torch.zeros(span, dtype=spec.dtype, device=device)  # a valid index
    return storage.as_strided(spec.shape, spec.stride)


def _instantiate(call: _Call, device: torch.device) -> tuple[tuple[Any, ...], dict[str, Any]]:
    def real(value: Any) -> Any:
        return _real(value, device) if isinstance(value, _Spec) else value

    is_spec: Callable[[Any], bool] = lambda value: isinstance(value, _Spec)  # noqa: E731
    return (
        tree_map(real, call.args, is_leaf=is_spec),
        tree_map(real, call.kwargs, is_leaf=is_spec),
    )


def _model_operator_rates(
    calls: list[_Call], backend: Accelerator, call_seconds: float, sizes: _Sizes
) -> dict[str, float]:
    """Bytes per second of each recorded operator, timed at its most common calls.

    Each operator's rate is its timed calls' bytes over their seconds (less the fixed
    cost per call), each call weighted by how often the step makes it, so that the
    cost model gives those calls their measured total time. Operators whose calls all
    fail on random values or take less than twice the fixed cost get no rate.
    """
    by_operator: dict[str, Counter[str]] = {}
    example: dict[str, _Call] = {}
    for call in calls:
        name = str(call.func)
        key = call.key()
        by_operator.setdefault(name, Counter())[key] += 1
        example.setdefault(key, call)
    device = backend.device()
    rates: dict[str, float] = {}
    with backend.fork_rng(), torch.no_grad():
        # The calls below go through the operator's Python object, which costs more
        # than the call of a module's code: that is the fixed cost taken off them.
        tiny = torch.ones(4, device=device)
        add = torch.ops.aten.add.Tensor
        overhead = _seconds(lambda: [add(tiny, tiny) for _ in range(100)], backend, sizes) / 100
        call_seconds = max(call_seconds, overhead)
        for name, counts in sorted(by_operator.items()):
            moved = seconds = 0.0
            for key, count in counts.most_common(sizes.shapes):
                timed = _time_call(example[key], device, backend, sizes)
                if timed is None or timed < sizes.short_call * call_seconds:
                    # It failed on real values, or it is as short as the fixed cost per
                    # call, which then prices it: its bytes say nothing of a rate.
                    continue
                moved += count * example[key].moved
                seconds += count * max(timed - call_seconds, timed / 10)
            if moved > 0 and seconds > 0:
                rates[name] = moved / seconds
    return rates


def _time_call(
    call: _Call, device: torch.device, backend: Accelerator, sizes: _Sizes
) -> float | None:
    """Median seconds of one call on fresh real tensors, or ``None`` if it fails on them."""
    mutates = any(
        arg.alias_info is not None and arg.alias_info.is_write
        for arg in call.func._schema.arguments
    )
    try:
        args, kwargs = _instantiate(call, device)
        if not mutates:
            return _seconds(lambda: call.func(*args, **kwargs), backend, sizes)
        # An in-place call gets fresh arguments per sample (made outside the timing), so
        # repeated calls do not compound (a mul_ run to infinity, a tensor grown denormal).
        call.func(*args, **kwargs)
        samples = []
        for _ in range(sizes.rounds):
            args, kwargs = _instantiate(call, device)
            backend.synchronize()
            start = time.perf_counter()
            call.func(*args, **kwargs)
            backend.synchronize()
            samples.append(time.perf_counter() - start)
        return statistics.median(samples)
    except Exception:  # values the call refuses (an index, a shape): skip it
        return None
