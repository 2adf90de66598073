"""What one operator call computes and moves, with no rate in it: the profile's features.

The profile (:mod:`._profile`) records an :class:`OpWork` per operator call and nothing
that depends on the device's speed; the cost pass (:func:`._pricing.cost`) turns the
features into seconds at given rates. A call's features:

* its FLOPs and their class (``kind``): matrix products (and a fused RNN layer's gate
  products), attention, convolutions, FFTs; an operator of no class has none;
* the bytes of its tensor arguments (each view's elements, not its whole storage) and of
  the new storages it returns, whether it writes to an argument, and whether it draws
  random numbers.

FLOPs come from ``torch.utils.flop_counter``'s formulas but for four: a convolution's
backward (:func:`convolution_backward_flops`: torch's formula counts a grouped
convolution's weight gradient ``groups`` times over), FFTs (:func:`fft_flops`: ``5 N
log2 N`` per transform of ``N`` points), grouped matrix products
(:func:`grouped_mm_flops`: a mixture of experts' expert layers) and the fused attention
kernels torch has no formula for (:func:`attention_flops`: the host CPU's and a
PrivateUse1 device's), which it does not count.

A fused attention call also records its *scores* (:func:`attention_scores`): the
query-key pairs of all its heads, each of which the kernel exponentiates and sums in
its softmax whatever the head size. With small heads that work, not the products,
takes the kernel's time (8-wide heads on a host CPU run at a third of 64-wide heads'
flop rate), so the cost pass prices it apart (:attr:`.DeviceRates.attention_score_seconds`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch.utils._pytree import tree_flatten

from ._cost import tensor_bytes

__all__ = [
    "ATTENTION",
    "CONVOLUTION",
    "FFT",
    "MATMUL",
    "OpWork",
    "attention_flops",
    "attention_scores",
    "convolution_backward_flops",
    "fft_flops",
    "grouped_mm_flops",
    "op_kind",
    "op_work",
]

#: The classes of FLOPs (:attr:`OpWork.kind`); an operator of none has ``""``.
MATMUL, ATTENTION, CONVOLUTION, FFT = "matmul", "attention", "convolution", "fft"

_MATMUL = frozenset({"mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "_int_mm", "_grouped_mm"})
_CONVOLUTION = frozenset({"convolution", "convolution_backward", "_convolution"})
_RNN_LAYERS = frozenset({"mkldnn_rnn_layer", "_cudnn_rnn", "_thnn_fused_lstm_cell"})
_FFT = frozenset({"_fft_r2c", "_fft_c2r", "_fft_c2c"})
#: Fused attention kernels whose ``(query, key, value)`` are ``(batch..., heads, length,
#: size)``: the first three tensor arguments of a forward, the three after the output's
#: gradient of a backward.
_FUSED_ATTENTION = frozenset(
    {
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_fused_attention_overrideable",
    }
)
#: Of those, the kernels ``flop_counter`` has no formula for, forward or backward (none
#: as of torch 2.13; where a later release adds one, its own is used, and counts as
#: :func:`attention_flops`).
_UNCOUNTED_ATTENTION = frozenset(
    {
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_fused_attention_overrideable",
    }
)
#: Allocations that leave their storage unwritten: the call returns memory it never
#: touches, and the operator that first writes it pays for the bytes.
_UNWRITTEN = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})


@dataclass(frozen=True)
class OpWork:
    """What one operator call computes and moves, as the profile records it.

    Attributes:
        operator: The overload's name (``"aten.gelu.default"``), which names its own
            byte rate where the rates have one.
        kind: The class of its FLOPs (:data:`MATMUL`, :data:`ATTENTION`,
            :data:`CONVOLUTION`, :data:`FFT`), or ``""``.
        flops: Its floating-point operations (0 for an operator of no class).
        read_bytes: Bytes of its tensor arguments (each view's elements).
        fresh_bytes: Bytes of the new storages it returns (0 for a view or an alias).
        mutates: Whether it writes to one of its arguments.
        random: Whether it draws random numbers (dropout's mask).
        scores: A fused attention call's query-key pairs over all its heads
            (:func:`attention_scores`); 0 for any other call.
    """

    operator: str
    kind: str
    flops: int
    read_bytes: int
    fresh_bytes: int
    mutates: bool
    random: bool
    scores: int = 0

    @property
    def moves(self) -> bool:
        """Whether the call moves memory.

        A view, an alias and a metadata query do not, and neither does an allocation
        left unwritten (``empty_like``): it returns pages it never touches.
        """
        if self.name in _UNWRITTEN:
            return False
        return self.fresh_bytes > 0 or self.mutates

    @property
    def name(self) -> str:
        """The operator's name without namespace or overload (``"gelu"``)."""
        parts = self.operator.split(".")
        return parts[1] if len(parts) > 1 else self.operator


def op_kind(func: Any) -> str:
    """The class of ``func``'s FLOPs (see :class:`OpWork`), or ``""``."""
    short = func._overloadpacket.__name__
    if short in _MATMUL or short in _RNN_LAYERS:
        return MATMUL
    if "attention" in short:
        return ATTENTION
    if short in _CONVOLUTION:
        return CONVOLUTION
    if short in _FFT:
        return FFT
    return ""


def op_work(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, fresh_bytes: int
) -> OpWork:
    """The features of one operator call (only shapes are read: tensors may be fake).

    Args:
        func: The ``torch._ops.OpOverload`` called.
        args: Its positional arguments.
        kwargs: Its keyword arguments.
        out: What it returned.
        fresh_bytes: Bytes of the new storages it created (0 for a view or an alias).

    Returns:
        The call's :class:`OpWork`.
    """
    kind = op_kind(func)
    return OpWork(
        operator=str(func),
        kind=kind,
        flops=_flops(func, args, kwargs, out) if kind else 0,
        read_bytes=sum(
            tensor_bytes(t) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)
        ),
        fresh_bytes=fresh_bytes,
        mutates=any(
            arg.alias_info is not None and arg.alias_info.is_write for arg in func._schema.arguments
        ),
        random=torch.Tag.nondeterministic_seeded in func.tags,
        scores=attention_scores(func, args) if kind == ATTENTION else 0,
    )


def _flop_registry() -> Mapping[Any, Any]:
    from torch.utils.flop_counter import flop_registry

    return flop_registry


def _flops(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    short = func._overloadpacket.__name__
    if short in _RNN_LAYERS:
        return _rnn_flops(args)
    if short in _FFT:
        return fft_flops(func, args, kwargs, out)
    if short == "convolution_backward":
        return convolution_backward_flops(func, args, kwargs)
    if short == "_grouped_mm":
        return grouped_mm_flops(func, args, kwargs)
    counter = _flop_registry().get(func._overloadpacket)
    if counter is None:
        uncounted = short.removesuffix("_backward") in _UNCOUNTED_ATTENTION
        return attention_flops(func, args) if uncounted else 0
    try:
        return int(counter(*args, **kwargs, out_val=out))
    except Exception:  # a formula that does not know this overload's arguments
        return 0


def _rnn_flops(args: tuple[Any, ...]) -> int:
    """Gate products of one fused RNN layer: 2 x steps x batch x (input + hidden) x gates."""
    tensors = [a for a in tree_flatten(args)[0] if isinstance(a, torch.Tensor)]
    if not tensors:
        return 0
    data = tensors[0]
    weights = [t for t in tensors[1:] if t.dim() == 2]
    rows = data.numel() // max(data.shape[-1], 1)
    return 2 * rows * sum(w.numel() for w in weights)


def _argument(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> Any:
    """The argument ``name`` of a call of ``func``, positional or keyword."""
    for position, argument in enumerate(func._schema.arguments):
        if argument.name == name:
            if position < len(args):
                return args[position]
            return kwargs.get(name, argument.default_value)
    raise KeyError(name)


def convolution_backward_flops(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """A convolution's backward FLOPs: ``2 |W| N S`` per gradient asked for.

    ``|W|`` is the weight's size (``C_out x C_in / groups x kernel``), ``N`` the batch
    and ``S`` the positions the kernel visits: the output's, or the input's for a
    transposed convolution. The input's gradient (a convolution of the output's gradient
    with the weight) and the weight's (of the input with the output's gradient) each
    pair every weight element with every visited position. ``flop_counter``'s formula
    gives the same count without groups, and ``groups`` times too much for the weight's
    gradient with them (every channel of the input against every channel of the output:
    a depthwise convolution's weight gradient ``C`` times over).
    """
    mask = _argument(func, args, kwargs, "output_mask")
    weight = _argument(func, args, kwargs, "weight")
    transposed = bool(_argument(func, args, kwargs, "transposed"))
    grad_output = _argument(func, args, kwargs, "grad_output")
    data = _argument(func, args, kwargs, "input")
    positions = math.prod((data if transposed else grad_output).shape[2:])
    per_gradient = 2 * weight.numel() * grad_output.shape[0] * positions
    return int((bool(mask[0]) + bool(mask[1])) * per_gradient)


def fft_flops(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    """An FFT's FLOPs: ``5 N log2 N`` per transform of ``N`` points.

    ``N`` is the product of the transformed dimensions' sizes on the signal's full side
    (the real input of ``_fft_r2c``, the real output of ``_fft_c2r``, the input of
    ``_fft_c2c``); the other dimensions count the transforms.
    """
    short = func._overloadpacket.__name__
    signal = out if short == "_fft_c2r" else _argument(func, args, kwargs, "self")
    if not isinstance(signal, torch.Tensor) or signal.numel() == 0:
        return 0
    dims = [d % signal.dim() for d in _argument(func, args, kwargs, "dim")]
    points = int(math.prod(signal.shape[d] for d in dims))
    if points <= 1:
        return 0
    transforms = signal.numel() // points
    return round(5 * transforms * points * math.log2(points))


def grouped_mm_flops(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """A grouped matrix product's FLOPs (``aten._grouped_mm``): ``2 M N K`` over its groups.

    The groups split one dimension between them (``offs``): the rows of a 2-D first
    operand (the tokens routed to each expert, against that expert's weight in a 3-D
    second operand), the columns of a 2-D second one, or, with both 2-D, the contracted
    dimension (each group's product stacked in the output). Each row meets each column
    of its own group once, so all the groups together count ``2 M N K`` as one product
    of those sizes would; two 3-D operands are a batch of ``G`` such products. A mixture
    of experts' expert layers run as this product (transformers' ``grouped_mm``), for
    which ``flop_counter`` has no formula.
    """
    first = _argument(func, args, kwargs, "self")
    second = _argument(func, args, kwargs, "mat2")
    batched = first.shape[0] if first.dim() == 3 and second.dim() == 3 else 1
    return int(2 * batched * first.shape[-2] * first.shape[-1] * second.shape[-1])


class _Attention(NamedTuple):
    """A fused attention call's shape: its query-key pairs and head sizes, and its pass."""

    pairs: int  # query positions x key positions x query heads x batch
    width: int  # the queries' and keys' head size
    value_width: int
    backward: bool


def _attention(func: Any, args: tuple[Any, ...]) -> _Attention | None:
    """The shape of a fused attention call (:data:`_FUSED_ATTENTION`), or ``None``."""
    short = func._overloadpacket.__name__
    backward = short.endswith("_backward")
    if short.removesuffix("_backward") not in _FUSED_ATTENTION:
        return None
    operands = tuple(args[1:4] if backward else args[:3])
    if len(operands) < 3 or not all(isinstance(t, torch.Tensor) and t.dim() >= 3 for t in operands):
        return None
    query, key, value = operands
    pairs = math.prod(query.shape[:-1]) * key.shape[-2]
    return _Attention(int(pairs), query.shape[-1], value.shape[-1], backward)


def attention_scores(func: Any, args: tuple[Any, ...]) -> int:
    """A fused attention call's scores: query positions x key positions x heads x batch.

    Each is a query-key pair the kernel exponentiates and sums (module docstring). A
    backward passes over each twice (it recomputes the probabilities and forms their
    gradient), so it counts each twice. Grouped-query attention counts the query's
    heads: each query head meets every key of its group's head. 0 for any other call.
    """
    shape = _attention(func, args)
    if shape is None:
        return 0
    return 2 * shape.pairs if shape.backward else shape.pairs


def attention_flops(func: Any, args: tuple[Any, ...]) -> int:
    """A fused attention call's FLOPs, as ``flop_counter`` counts its other kernels'.

    Forward: the scores' product and the probabilities' product with the values,
    ``2 P (d_qk + d_v)`` for ``P`` query-key pairs (:func:`attention_scores`). Backward:
    the scores again, the gradients of the probabilities and of the values, then those
    of the queries and keys, ``2 P (3 d_qk + 2 d_v)``. 0 for any other call.
    """
    shape = _attention(func, args)
    if shape is None:
        return 0
    if shape.backward:
        return 2 * shape.pairs * (3 * shape.width + 2 * shape.value_width)
    return 2 * shape.pairs * (shape.width + shape.value_width)
