"""Byte rates for the operators one model's step calls, timed at the step's own shapes.

:func:`record_calls` runs one training step of the model on fake tensors (forward and
backward, as the planner's profile does) and keeps the calls the cost model prices by
bytes; :func:`model_operator_rates` times each operator at its most common shapes and
dtypes on new random tensors on the device, out of its caches as in a step
(:func:`._stopwatch.cold_seconds`). Only for
:func:`._calibrate.calibrate_rates`: planning never calls it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from accel import Accelerator

from ..._measure import storage_key
from ..._steps import require_grad, tensors_of
from .._layouts import DeviceLayouts
from .._leftovers import leaving_nothing, tracking
from .._pricing import by_bytes
from .._profile import call_with_state, fake_state
from .._sharded import unsharded
from .._work import op_work
from . import _stopwatch
from ._stopwatch import Sizes

__all__ = ["model_operator_rates", "record_calls"]


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
    moved: int  # inputs + new storages, as the cost pass counts them

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
    """Records the operator calls the cost pass prices by bytes per second."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[_Call] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not _safe_to_time(func):
            return out
        inputs = {storage_key(t) for t in tensors_of((args, kwargs))}
        fresh = {storage_key(t): t for t in tensors_of(out) if storage_key(t) not in inputs}
        fresh_bytes = sum(t.untyped_storage().nbytes() for t in fresh.values())
        work = op_work(func, args, kwargs, out, fresh_bytes)
        if not by_bytes(work):
            return out  # priced by flops, by random_bytes, or per call only
        moved = work.read_bytes + work.fresh_bytes
        if moved > 0:
            self.calls.append(_Call(func, tree_map(_spec, args), tree_map(_spec, kwargs), moved))
        return out


def record_calls(model: nn.Module, example_inputs: Any) -> list[_Call]:
    """The priced-by-bytes operator calls of one step of ``model``, run on fake tensors."""
    recorder = _Recorder()
    try:
        with leaving_nothing(model), unsharded(model):
            _fake_step(model, example_inputs, recorder)
    except ValueError:
        raise
    except Exception as error:  # reported with what to do instead
        raise RuntimeError(
            "checkpointing: calibrate_rates could not run the model's step on fake tensors "
            f"({type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}). "
            "Calibrate without model= (the per-operator rates then are the built-in ones)."
        ) from error
    return recorder.calls


def _fake_step(model: nn.Module, example_inputs: Any, recorder: _Recorder) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)  # a cache's real tensors: constants
    with mode:
        state = fake_state(model, mode)
        inputs = tree_map(
            lambda t: mode.from_tensor(t) if isinstance(t, torch.Tensor) else t,
            example_inputs,
        )
    with ExitStack() as stack:
        stack.enter_context(mode)
        # As the planner's profile lays them out (a grouped product's float32 outputs,
        # batch norm's layouts): the same calls, and a step the fake kernels accept.
        stack.enter_context(DeviceLayouts())
        stack.enter_context(tracking())
        stack.enter_context(recorder)
        output = call_with_state(model, state, inputs)
        outputs = require_grad(output)
        torch.autograd.backward(outputs, [torch.ones_like(t) for t in outputs])


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


def model_operator_rates(
    calls: list[_Call],
    backend: Accelerator,
    call_seconds: float,
    memory_bytes: float,
    sizes: Sizes,
) -> dict[str, float]:
    """Bytes per second of each recorded operator, timed at its most common calls.

    Each operator's rate is its timed calls' bytes over their seconds (less the fixed
    cost per call), each call weighted by how often the step makes it, so that the
    cost model gives those calls their measured total time. A call says nothing of a
    rate where its time is the fixed cost's: it fails on random values, it takes less
    than ``sizes.short_call`` fixed costs, or its bytes at the general rate
    ``memory_bytes`` would (a rate taken from such calls holds their fixed cost
    and, applied to a large call of the same operator, prices it thousands of times too
    high: an in-place add timed on a scalar priced a 4 MiB one at a third of a second).
    Operators with no such call get no rate.
    """
    by_operator: dict[str, Counter[str]] = {}
    # Keyed by operator and arguments: a tanh and a sigmoid of one tensor share their
    # arguments, and each must be timed as itself (until 2026-12-04 the first operator
    # seen with those arguments was timed for both).
    example: dict[tuple[str, str], _Call] = {}
    for call in calls:
        name = str(call.func)
        key = call.key()
        by_operator.setdefault(name, Counter())[key] += 1
        example.setdefault((name, key), call)
    device = backend.device()
    rates: dict[str, float] = {}
    with backend.fork_rng(), torch.no_grad():
        # The calls below go through the operator's Python object, which costs more
        # than the call of a module's code: that is the fixed cost taken off them.
        tiny = torch.ones(4, device=device)
        add = torch.ops.aten.add.Tensor
        repeated = _stopwatch.seconds(lambda: [add(tiny, tiny) for _ in range(100)], backend, sizes)
        overhead = repeated / 100
        call_seconds = max(call_seconds, overhead)
        for name, counts in sorted(by_operator.items()):
            moved = seconds = 0.0
            for key, count in counts.most_common(sizes.shapes):
                call = example[name, key]
                timed = _time_call(call, device, backend, sizes)
                small = call.moved / memory_bytes < sizes.short_call * call_seconds
                if timed is None or small or timed < sizes.short_call * call_seconds:
                    # It failed on real values, or the fixed cost per call prices it:
                    # its bytes say nothing of a rate.
                    continue
                moved += count * call.moved
                seconds += count * max(timed - call_seconds, timed / 10)
            if moved > 0 and seconds > 0:
                rates[name] = moved / seconds
    return rates


def _time_call(
    call: _Call, device: torch.device, backend: Accelerator, sizes: Sizes
) -> float | None:
    """Median seconds of one call on real tensors, or ``None`` if it fails on them.

    Timed out of the caches (:func:`._stopwatch.cold_seconds`), as in a step.
    """
    mutates = any(
        arg.alias_info is not None and arg.alias_info.is_write
        for arg in call.func._schema.arguments
    )
    try:
        if mutates:  # fresh arguments per sample, or its work would compound
            setup = lambda: _instantiate(call, device)  # noqa: E731
        else:
            made = _instantiate(call, device)
            setup = lambda: made  # noqa: E731
        return _stopwatch.cold_seconds(
            setup, lambda args: call.func(*args[0], **args[1]), call.moved, backend, sizes
        )
    except Exception:  # values the call refuses (an index, a shape): skip it
        return None
