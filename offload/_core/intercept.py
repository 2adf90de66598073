"""The layers that write their weights' gradients in place, and when they do.

While :meth:`Interception.active` is in force (or between :meth:`Interception.enter` and
:meth:`Interception.exit`), a ``TorchFunctionMode`` sends ``F.linear`` and ``F.embedding``
on weights a :class:`offload._core.grads.GradientSink` tracks to autograd Functions whose
backward writes the weight's gradient into the sink's destination:

* ``F.linear``: the weight gradient as ``torch.mm(grad.t(), input, out=...)`` and the
  bias gradient as ``torch.sum(grad, 0, out=...)``, the very kernels autograd runs, and
  the input gradient as autograd computes it;
* ``F.embedding`` (float32 and float64, the dtypes whose autograd kernel sums the rows in
  the same order): ``index_add_`` of the output gradient's rows, padding rows left out.

Everything else runs as usual: a convolution, a linear layer under autocast or with mixed
dtypes, a sparse, rescaled or max-norm embedding, a tensor subclass, an embedding under
``torch.use_deterministic_algorithms`` (``index_add_`` is not deterministic on every
device). Autograd then allocates the gradient and adds it into the destination preset
as ``.grad``; a tracer of backward's allocations sees exactly those.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable
from torch.overrides import TorchFunctionMode

from .grads import Destination, GradientSink, Like, Target

__all__ = ["Interception"]

_PLAIN = (torch.Tensor, nn.Parameter)
_EXACT_EMBEDDING = (torch.float32, torch.float64)


class Interception:
    """Puts a sink's writing layers in force; nested :meth:`enter` calls count.

    Args:
        sink: Where the gradients go.
    """

    def __init__(self, sink: GradientSink) -> None:
        self.sink = sink
        self._mode: _Intercept | None = None
        self._depth = 0

    @contextmanager
    def active(self) -> Iterator[None]:
        """Route tracked layers through the writing Functions while the block runs."""
        self.enter()
        try:
            yield
        finally:
            self.exit()

    def enter(self) -> None:
        """Start intercepting (nested calls count; :meth:`exit` ends the outermost)."""
        if self._depth == 0:
            self._mode = _Intercept(self.sink)
            self._mode.__enter__()
        self._depth += 1

    def exit(self) -> None:
        """End one :meth:`enter`."""
        if self._depth == 0:
            return
        self._depth -= 1
        if self._depth == 0 and self._mode is not None:
            mode, self._mode = self._mode, None
            mode.__exit__(None, None, None)

    def reset(self) -> None:
        """End every :meth:`enter` (after an exception skipped their exits)."""
        while self._depth:
            self.exit()


def _plain(*tensors: torch.Tensor | None) -> bool:
    return all(t is None or type(t) in _PLAIN for t in tensors)


def _autocast(device: torch.device) -> bool:
    return bool(torch.is_autocast_enabled(device.type))


class _Intercept(TorchFunctionMode):
    """Sends ``F.linear`` and ``F.embedding`` on tracked weights to the writing Functions."""

    def __init__(self, sink: GradientSink) -> None:
        super().__init__()
        self.sink = sink

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if torch.is_grad_enabled():
            if func is F.linear:
                result = self._linear(*args, **kwargs)
                if result is not NotImplemented:
                    return result
            elif func is F.embedding:
                result = self._embedding(*args, **kwargs)
                if result is not NotImplemented:
                    return result
        return func(*args, **kwargs)

    def _linear(
        self, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> Any:
        target = self.sink.target(weight)
        if (
            target is None
            or not weight.requires_grad
            or not _plain(input, weight, bias)
            or not weight.is_floating_point()  # a complex one's gradient is conjugated
            or weight.dim() != 2
            or not weight.is_contiguous()
            or input.dim() < 2
            or (input.dim() > 2 and not input.is_contiguous())
            or input.dtype != weight.dtype
            or (bias is not None and (bias.dtype != weight.dtype or bias.dim() != 1))
            or _autocast(weight.device)
        ):
            return NotImplemented
        bias_target = None if bias is None else self.sink.target(bias)
        return _Linear.apply(self.sink, target, bias_target, input, weight, bias)

    def _embedding(
        self,
        input: torch.Tensor,
        weight: torch.Tensor,
        padding_idx: int | None = None,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        sparse: bool = False,
    ) -> Any:
        target = self.sink.target(weight)
        if (
            target is None
            or not weight.requires_grad
            or not _plain(input, weight)
            or weight.dtype not in _EXACT_EMBEDDING
            or weight.dim() != 2
            or not weight.is_contiguous()
            or max_norm is not None
            or scale_grad_by_freq
            or sparse
            # index_add_ is not deterministic on every device.
            or torch.are_deterministic_algorithms_enabled()
        ):
            return NotImplemented
        return _Embedding.apply(self.sink, target, input, weight, padding_idx)


def _destination(target: Target | None) -> Destination | None:
    """Where to write, or ``None`` to hand the gradient to autograd as usual.

    Only a backward that accumulates into ``.grad`` (``loss.backward()``) writes in place;
    ``torch.autograd.grad`` and ``backward(inputs=...)`` want the gradients themselves.
    """
    if target is None or not torch.autograd._is_checkpoint_valid():
        return None
    return target.destination()


class _Linear(torch.autograd.Function):
    """``F.linear``, whose backward writes the weight and bias gradients in place."""

    @staticmethod
    def forward(
        ctx: Any,
        sink: GradientSink,
        target: Target,
        bias_target: Target | None,
        input: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
    ) -> torch.Tensor:
        ctx.sink, ctx.target, ctx.bias_target = sink, target, bias_target
        ctx.like = Like.of(weight)
        ctx.bias_like = None if bias is None else Like.of(bias)
        ctx.save_for_backward(input, weight)
        return F.linear(input, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        input, weight = ctx.saved_tensors
        sink: GradientSink = ctx.sink
        rows = grad.reshape(-1, grad.shape[-1])
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[3]:
            grad_input = rows.mm(weight).view(input.shape)
        if ctx.needs_input_grad[4]:
            flat = input.reshape(-1, input.shape[-1])
            destination = _destination(ctx.target)
            if destination is None:
                grad_weight = rows.t().mm(flat)
            else:
                grad_weight = sink.write(
                    destination, lambda out: torch.mm(rows.t(), flat, out=out), ctx.like
                )
        if ctx.needs_input_grad[5]:
            destination = _destination(ctx.bias_target)
            if destination is None:
                grad_bias = rows.sum(0)
            else:
                grad_bias = sink.write(
                    destination, lambda out: torch.sum(rows, 0, out=out), ctx.bias_like
                )
        return None, None, None, grad_input, grad_weight, grad_bias


class _Embedding(torch.autograd.Function):
    """``F.embedding``, whose backward adds the rows' gradients into the weight's place."""

    @staticmethod
    def forward(
        ctx: Any,
        sink: GradientSink,
        target: Target,
        input: torch.Tensor,
        weight: torch.Tensor,
        padding_idx: int | None,
    ) -> torch.Tensor:
        output = F.embedding(input, weight, padding_idx)
        ctx.sink, ctx.target = sink, target
        ctx.rows = weight.shape[0]
        ctx.padding = -1 if padding_idx is None else padding_idx % weight.shape[0]
        ctx.like = Like.of(weight)
        ctx.save_for_backward(input)
        return output

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        (input,) = ctx.saved_tensors
        sink: GradientSink = ctx.sink
        destination = _destination(ctx.target)
        if destination is None:
            return (
                None,
                None,
                None,
                torch.ops.aten.embedding_backward(grad, input, ctx.rows, ctx.padding, False, False),
                None,
            )
        indices = input.reshape(-1)
        rows = grad.reshape(-1, grad.shape[-1])
        if ctx.padding >= 0:
            keep = indices != ctx.padding
            indices, rows = indices[keep], rows[keep]
        handed = sink.write(
            destination, lambda out: out.zero_().index_add_(0, indices, rows), ctx.like
        )
        return None, None, None, handed, None
