"""``calibrate_rates``: a device's rates for the cost model, measured on the device.

It times a matrix product, a convolution, attention (at two head sizes: its flop rate
and its cost per score, :func:`attention_fit`), a pointwise operator, a random
draw, an operator call's fixed cost, a copy to pinned host memory and back (off the
host), and the pointwise, normalisation, reduction and
copy operators of a reference step (:class:`_Reference`), each with :mod:`._stopwatch`,
plus a selective policy's costs (:mod:`._overheads`) and the saved-tensor grain's
(per saved tensor, per replayed call, per packed mask byte: :mod:`._saved_machinery`), and
returns them as :class:`DeviceRates`. With ``model`` and ``example_inputs`` it also
records the operator calls of one training step of that model on fake tensors
(forward and backward, as the planner's profile does), and times each such operator at
its most common shapes and dtypes, on real random tensors (:mod:`._operator_rates`).
``save=True`` caches the rates for the device (``.._default_rates``), where
:func:`default_rates` and so every later planning on that machine finds them.
Calibrated rates change estimates and so plans; they are recorded in every plan made
with them (and the plan's note names the cache file), so a plan can be reproduced from
its file.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import torch
from torch import nn

import accel
from accel import Accelerator

from ..._args import require_bool, resolve_backend
from ..._selective import unavailable_reason
from .._cost import DeviceRates, tensor_bytes
from .._default_rates import device_name, save_rates
from .._tables import builtin_rates
from . import _stopwatch
from ._operator_rates import model_operator_rates, record_calls
from ._overheads import region_overhead, selective_overhead
from ._saved_machinery import saved_machinery
from ._stopwatch import Sizes, cold_seconds, seconds

__all__ = ["calibrate_rates"]


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
        operators = model_operator_rates(
            calls, device_backend, rates.call_seconds, rates.memory_bytes, sizes
        )
        rates = replace(rates, operator_bytes={**rates.operator_bytes, **operators})
    if save:
        save_rates(rates, device_backend)
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
        attention, score = _attention_rates(backend, sizes)
        x = torch.randn(sizes.elements, device=device)
        moved = 3 * tensor_bytes(x)
        memory = moved / cold_seconds(lambda: x, lambda x: x + x, moved, backend, sizes)
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
    operators = model_operator_rates(calls, backend, call, memory, sizes)
    # Without the operator grain (torch 2.4) no plan pays a selective policy: the base
    # rates' figures stay.
    per_call, per_kept = (
        (base.policy_call_seconds, base.policy_kept_seconds)
        if unavailable_reason() is not None
        else selective_overhead(backend, sizes)
    )
    region, region_tensor = region_overhead(backend, sizes)
    to_host, to_device = _copy_rates(backend, sizes, base)
    where = (
        f"calibrated on {device_name(backend)}, torch {torch.__version__}, "
        f"{time.strftime('%Y-%m-%d')}"
    )
    measured = replace(
        base,
        source=where,
        matmul_flops=matmul,
        attention_flops=attention,
        attention_score_seconds=score,
        convolution_flops=convolution,
        memory_bytes=memory,
        random_bytes=random,
        call_seconds=call,
        policy_call_seconds=per_call,
        policy_kept_seconds=per_kept,
        region_seconds=region,
        region_tensor_seconds=region_tensor,
        operator_bytes=operators,
        to_host_bytes=to_host,
        to_device_bytes=to_device,
    )
    # Last: the replayed calls' own work is priced at the rates measured above.
    return replace(measured, **saved_machinery(backend, sizes, measured)._asdict())


#: The head sizes attention is timed at: the common one, and one where the softmax rules.
_WIDE_HEAD, _NARROW_HEAD = 64, 8


def _attention_rates(backend: Accelerator, sizes: Sizes) -> tuple[float, float]:
    """Fused attention's flop rate and seconds per score (:func:`attention_fit`).

    Timed on 4 x 8 heads of ``sizes.sequence`` positions, 64 and 8 wide: the same
    scores, eight times the products.
    """

    def timed(width: int) -> float:
        q = torch.randn(4, 8, sizes.sequence, width, device=backend.device())
        return seconds(lambda: nn.functional.scaled_dot_product_attention(q, q, q), backend, sizes)

    scores = 4 * 8 * sizes.sequence**2
    wide = timed(_WIDE_HEAD)
    return attention_fit(scores, _WIDE_HEAD, _NARROW_HEAD, wide, timed(_NARROW_HEAD))


def attention_fit(
    scores: int, wide: int, narrow: int, wide_seconds: float, narrow_seconds: float
) -> tuple[float, float]:
    """The flop rate and seconds per score that price two attention timings exactly.

    A forward of ``scores`` query-key pairs with heads ``d`` wide does ``4 scores d``
    flops, priced ``flops / rate + scores x per_score``: the wide heads' extra flops over
    the narrow ones' give the rate, and what the narrow heads take beyond their flops
    the cost per score. Where the narrow heads take no longer per flop than the wide
    (a device whose attention runs at one flop rate whatever the head size), or the
    timings do not tell (noise), the rate is the wide heads' and the score costs 0,
    as attention was priced before the score cost.
    """
    wide_flops, narrow_flops = 4 * scores * wide, 4 * scores * narrow
    plain = (wide_flops / wide_seconds, 0.0)
    extra = wide_seconds - narrow_seconds
    if extra <= 0 or narrow_seconds * wide_flops <= wide_seconds * narrow_flops:
        return plain
    rate = (wide_flops - narrow_flops) / extra
    return rate, (narrow_seconds - narrow_flops / rate) / scores


def _copy_rates(backend: Accelerator, sizes: Sizes, base: DeviceRates) -> tuple[float, float]:
    """Bytes per second copied between pinned host memory and the device, each way.

    The offload grain's rates. Where the device is the host, or lazy (a copy would run
    its pending graph), no copy is timed and the base rates stay: the grain is not
    offered there.
    """
    device = backend.device()
    if device.type == "cpu" or backend.is_lazy:
        return base.to_host_bytes, base.to_device_bytes
    host = backend.empty_pinned((sizes.elements,), torch.float32)
    on_device = torch.empty(sizes.elements, device=device)
    nbytes = tensor_bytes(on_device)
    pinned = backend.supports_pinned_memory
    to_host = nbytes / seconds(lambda: host.copy_(on_device, non_blocking=pinned), backend, sizes)
    to_device = nbytes / seconds(lambda: on_device.copy_(host, non_blocking=pinned), backend, sizes)
    return to_host, to_device
