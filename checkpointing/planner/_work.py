"""What one operator call computes and moves, with no rate in it: the profile's features.

The profile (:mod:`._profile`) records an :class:`OpWork` per operator call and nothing
that depends on the device's speed; the cost pass (:func:`._pricing.cost`) turns the
features into seconds at given rates. A call's features:

* its FLOPs and their class (``kind``): matrix products (and a fused RNN layer's gate
  products), attention, convolutions, FFTs; an operator of no class has none;
* the bytes of its tensor arguments (each view's elements, not its whole storage) and of
  the new storages it returns, whether it writes to an argument, and whether it draws
  random numbers.

FLOPs come from ``torch.utils.flop_counter``'s formulas but for three: a convolution's
backward (:func:`convolution_backward_flops`: torch's formula counts a grouped
convolution's weight gradient ``groups`` times over), FFTs (:func:`fft_flops`: ``5 N
log2 N`` per transform of ``N`` points) and grouped matrix products
(:func:`grouped_mm_flops`: a mixture of experts' expert layers), which it does not count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from ._cost import tensor_bytes

__all__ = [
    "ATTENTION",
    "CONVOLUTION",
    "FFT",
    "MATMUL",
    "OpWork",
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
    """

    operator: str
    kind: str
    flops: int
    read_bytes: int
    fresh_bytes: int
    mutates: bool
    random: bool

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
        return 0
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
