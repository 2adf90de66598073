"""Gradients written straight into fixed device memory, so that backward allocates none.

Autograd computes a linear layer's weight gradient into a fresh tensor, the matrix
product of the output gradient and the input, and only then adds it into ``.grad``. On
a device under a memory cap that is one weight-sized allocation and free per layer and
micro-batch, which a caching allocator can serve only by freeing its cache and retrying.

A :class:`GradientSink` knows, for each offloaded tensor the layers compute with, where
its gradient goes: a :class:`Destination`, the tensor's place in the wrapper's fixed
gradient memory, asked of the tensor's :class:`Target` when backward needs it. While
:meth:`GradientSink.intercepting` is in force, the layers that hold most parameters run
through autograd Functions whose backward writes there with ``out=`` kernels:

* ``F.linear``: the weight gradient as ``torch.mm(grad.t(), input, out=...)`` and the
  bias gradient as ``torch.sum(grad, 0, out=...)``, the very kernels autograd runs;
* ``F.embedding`` (float32 and float64, the dtypes whose autograd kernel sums rows in the
  same order): ``index_add_`` of the output gradient's rows.

A destination that holds nothing yet is overwritten. A later contribution (another
micro-batch, a tied weight's other use, a gradient left from an earlier backward) goes
into one scratch tensor per dtype, as large as the largest tracked tensor and allocated
once, and is then added in place: autograd's own two roundings (a fresh product, an
in-place add), so results are the plain model's bit for bit, in the parameter's dtype,
as the plain model accumulates them.

Everything else runs as usual: a convolution, a linear layer under autocast or with mixed
dtypes, a sparse, rescaled or max-norm embedding, a tensor subclass. Autograd then
allocates the gradient and adds it into the destination preset as ``.grad``; a tracer
of backward's allocations sees exactly those.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

from accel import _compat

from .transfer import expanded_zeros

__all__ = ["Destination", "Destinations", "GradientSink", "Target", "standalone"]

_PLAIN = (torch.Tensor, nn.Parameter)
_EXACT_EMBEDDING = (torch.float32, torch.float64)


@dataclass
class Destination:
    """Where one tensor's gradient is written: ``tensor``, laid out as the parameter.

    ``empty_at`` is the version ``tensor`` had when it held nothing (zeros, or memory
    whose contents do not matter); while the version has not moved, the next write
    replaces the contents instead of adding to them.
    """

    tensor: torch.Tensor
    empty_at: int | None = field(default=None)

    @classmethod
    def empty(cls, tensor: torch.Tensor) -> Destination:
        """A destination that holds nothing yet (whatever its memory contains)."""
        return cls(tensor, tensor._version)

    @property
    def is_empty(self) -> bool:
        """Whether nothing has been written since it was made empty."""
        return self.empty_at == self.tensor._version


class Target(Protocol):
    """Where a tracked tensor's gradient goes now."""

    def destination(self) -> Destination | None:
        """The destination, or ``None`` to let autograd hand the gradient on as usual."""
        ...


class Destinations:
    """Open destinations by key (a parameter's ``id``), and targets that read them."""

    def __init__(self) -> None:
        self._open: dict[int, Destination] = {}

    def open(self, key: int, destination: Destination) -> None:
        """Send the gradient of ``key`` to ``destination`` until :meth:`close`."""
        self._open[key] = destination

    def close(self, key: int) -> None:
        """Stop sending the gradient of ``key`` anywhere (a no-op if none is open)."""
        self._open.pop(key, None)

    def target(self, key: int) -> Target:
        """The target of ``key``: its open destination whenever backward asks."""
        return _Keyed(self._open, key)


def standalone(view: torch.Tensor) -> torch.Tensor:
    """A tensor of its own on ``view``'s memory (``set_``, not a view).

    Its version counter moves only when it is written itself, not when a neighbour in the
    same flat memory is, so :class:`Destination` can tell whether it was written.
    """
    alone = torch.empty(0, dtype=view.dtype, device=view.device)
    with torch.no_grad():
        alone.set_(view.untyped_storage(), view.storage_offset(), view.shape, view.stride())
    return alone


@dataclass(frozen=True)
class _Keyed:
    table: dict[int, Destination]
    key: int

    def destination(self) -> Destination | None:
        return self.table.get(self.key)


class GradientSink:
    """The destinations of one wrapper's gradients, and the layers that write into them.

    A tracked tensor that is a leaf (a parameter whose ``.data`` was swapped) must have
    its destination as its ``.grad``: after writing there, backward hands the leaf no
    gradient, and its ``AccumulateGrad`` still runs its post-accumulate-grad hooks (where
    a release skips them without a gradient, backward hands it zeros that take no
    memory, which ``AccumulateGrad`` adds in place). A tracked copy gets nothing: its
    producer reads the destination.
    """

    def __init__(self) -> None:
        self._targets: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._largest: dict[torch.dtype, int] = {}
        self._scratch: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}
        self._mode: _Intercept | None = None
        self._depth = 0

    # What is tracked --------------------------------------------------------------------

    def reserve(self, tensors: Iterable[torch.Tensor]) -> None:
        """Size the scratch memory for gradients as large as ``tensors``."""
        for tensor in tensors:
            if tensor.requires_grad:
                numel = self._largest.get(tensor.dtype, 0)
                self._largest[tensor.dtype] = max(numel, tensor.numel())

    def track(self, tensor: torch.Tensor, target: Target) -> None:
        """Send the gradient of layers computing with ``tensor`` to ``target``."""
        self._targets[tensor] = target

    def target(self, tensor: torch.Tensor) -> Target | None:
        """The target of ``tensor`` (``None``: not tracked)."""
        target: Target | None = self._targets.get(tensor)
        return target

    # Interception ---------------------------------------------------------------------

    @contextmanager
    def intercepting(self) -> Iterator[None]:
        """Route tracked layers through the writing Functions while the block runs."""
        self.enter()
        try:
            yield
        finally:
            self.exit()

    def enter(self) -> None:
        """Start intercepting (nested calls count; :meth:`exit` ends the outermost)."""
        if self._depth == 0:
            self._mode = _Intercept(self)
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

    # Writing ----------------------------------------------------------------------------

    def write(self, destination: Destination, kernel: Callable[[torch.Tensor], object]) -> None:
        """Put what ``kernel(out)`` computes into ``out`` into ``destination``.

        Straight in when the destination is empty; otherwise into the scratch memory,
        then added in place.
        """
        if destination.is_empty:
            kernel(destination.tensor)
            return
        scratch = self._scratch_like(destination.tensor)
        kernel(scratch)
        destination.tensor.add_(scratch)

    def _scratch_like(self, tensor: torch.Tensor) -> torch.Tensor:
        key = (tensor.dtype, tensor.device)
        flat = self._scratch.get(key)
        if flat is None or flat.numel() < tensor.numel():
            numel = max(self._largest.get(tensor.dtype, 0), tensor.numel())
            flat = torch.empty(numel, dtype=tensor.dtype, device=tensor.device)
            self._scratch[key] = flat
        return flat[: tensor.numel()].view(tensor.shape)

    @staticmethod
    def handed_on(like: _Like) -> torch.Tensor | None:
        """What backward returns for a gradient it wrote into ``like``'s destination."""
        if like.leaf and not _compat.post_accumulate_hooks_run_without_gradient():
            return expanded_zeros(like.shape, like.dtype, like.device)
        return None


@dataclass(frozen=True)
class _Like:
    """What backward needs to know of a tracked tensor, without holding its memory."""

    shape: torch.Size
    dtype: torch.dtype
    device: torch.device
    leaf: bool

    @classmethod
    def of(cls, tensor: torch.Tensor) -> _Like:
        return cls(tensor.shape, tensor.dtype, tensor.device, tensor.grad_fn is None)


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
        ctx.like = _Like.of(weight)
        ctx.bias_like = None if bias is None else _Like.of(bias)
        ctx.save_for_backward(input, weight)
        return F.linear(input, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        input, weight = ctx.saved_tensors
        sink: GradientSink = ctx.sink
        rows = grad.reshape(-1, grad.shape[-1])
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[3]:
            grad_input = rows.mm(weight).view(input.shape)
        if ctx.needs_input_grad[4]:
            flat = input.reshape(-1, input.shape[-1])
            destination = ctx.target.destination()
            if destination is None:
                grad_weight = rows.t().mm(flat)
            else:
                sink.write(destination, lambda out: torch.mm(rows.t(), flat, out=out))
                grad_weight = sink.handed_on(ctx.like)
        if ctx.needs_input_grad[5]:
            destination = None if ctx.bias_target is None else ctx.bias_target.destination()
            if destination is None:
                grad_bias = rows.sum(0)
            else:
                sink.write(destination, lambda out: torch.sum(rows, 0, out=out))
                grad_bias = sink.handed_on(ctx.bias_like)
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
        ctx.like = _Like.of(weight)
        ctx.save_for_backward(input)
        return output

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        (input,) = ctx.saved_tensors
        sink: GradientSink = ctx.sink
        destination = ctx.target.destination()
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
        sink.write(destination, lambda out: out.zero_().index_add_(0, indices, rows))
        return None, None, None, sink.handed_on(ctx.like), None
