"""Values crossing a slice boundary: tensors apart from the rest, and micro-batches.

A layer's return value becomes the next layer's positional arguments (a tuple is
unpacked, anything else is one argument), and the model's keyword arguments go to every
layer, as in::

    for layer in layers:
        out = layer(*out, **kwargs)

:func:`flatten` separates the tensors (which autograd must see) from the other values
(kept as they are); :func:`unflatten` puts them back. Tensors hidden inside lists or
dicts are refused with a clear error, since they could be neither moved nor
differentiated.

Micro-batches split the positional tensors whose first dimension is the batch size, and
the keyword tensors the user marked as batched (:func:`chunk_bounds` gives the same
bounds as ``torch.tensor_split``: unequal last chunks are fine); other tensors and
values go whole to every micro-batch.
:func:`merge` joins the micro-batches' outputs again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .._errors import OffloadError

__all__ = ["Spec", "chunk_bounds", "flatten", "merge", "unflatten"]


@dataclass(frozen=True)
class _Slot:
    """Where the ``index``-th tensor goes."""

    index: int


@dataclass(frozen=True)
class Spec:
    """The non-tensor values of a boundary and where its tensors go.

    Attributes:
        args: Positional values, with a slot in place of each tensor.
        kwargs: Keyword values, likewise.
        count: How many tensors there are.
    """

    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...]
    count: int

    def keyword_indices(self) -> frozenset[int]:
        """Indices of the tensors that are keyword values."""
        return frozenset(v.index for _, v in self.kwargs if isinstance(v, _Slot))

    def keyword_names(self) -> dict[int, str]:
        """The keyword of each tensor that is a keyword value, by tensor index."""
        return {v.index: name for name, v in self.kwargs if isinstance(v, _Slot)}

    def same_values(self, other: Spec) -> bool:
        """Whether ``other`` has the same slots and equal non-tensor values."""
        try:
            return bool(self.args == other.args and self.kwargs == other.kwargs)
        except Exception:
            return False


def _contains_tensor(value: Any, depth: int = 0) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if depth > 4:
        return False
    if isinstance(value, Mapping):
        return any(_contains_tensor(item, depth + 1) for item in value.values())
    if isinstance(value, list | tuple | set | frozenset):
        return any(_contains_tensor(item, depth + 1) for item in value)
    return False


def _slot_for(value: Any, tensors: list[torch.Tensor], where: str) -> Any:
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return _Slot(len(tensors) - 1)
    if _contains_tensor(value):
        raise OffloadError(
            f"offload: {where} is a {type(value).__name__} that contains tensors; tensors "
            "crossing a slice boundary must be top-level values (return a tuple of tensors "
            "and other values, or pass them as separate keyword arguments)."
        )
    return value


def flatten(
    args: Sequence[Any], kwargs: Mapping[str, Any], *, where: str = "a value"
) -> tuple[list[torch.Tensor], Spec]:
    """Split positional and keyword values into their tensors and a :class:`Spec`."""
    tensors: list[torch.Tensor] = []
    slots = tuple(
        _slot_for(value, tensors, f"{where} (position {position})")
        for position, value in enumerate(args)
    )
    keyword = tuple(
        (name, _slot_for(value, tensors, f"{where} (keyword {name!r})"))
        for name, value in kwargs.items()
    )
    return tensors, Spec(slots, keyword, len(tensors))


def unflatten(spec: Spec, tensors: Sequence[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Put ``tensors`` back into the positions ``spec`` recorded."""

    def fill(value: Any) -> Any:
        return tensors[value.index] if isinstance(value, _Slot) else value

    return tuple(fill(value) for value in spec.args), {k: fill(v) for k, v in spec.kwargs}


def chunk_bounds(batch: int, parts: int) -> list[tuple[int, int]]:
    """Return ``(start, length)`` of each micro-batch, as ``torch.tensor_split`` cuts.

    ``min(parts, batch)`` micro-batches; the first ``batch % parts`` are one longer.
    """
    parts = max(1, min(parts, batch))
    base, extra = divmod(batch, parts)
    bounds, start = [], 0
    for index in range(parts):
        length = base + (1 if index < extra else 0)
        bounds.append((start, length))
        start += length
    return bounds


def is_batched(tensor: torch.Tensor, batch: int | None) -> bool:
    """Whether ``tensor`` is split into micro-batches (its first dimension is the batch)."""
    return batch is not None and tensor.dim() > 0 and tensor.shape[0] == batch


def _same_view(tensors: Sequence[torch.Tensor]) -> bool:
    first = tensors[0]
    if all(t is first for t in tensors[1:]):
        return True
    # A lazy device's tensors report data_ptr() 0: there only the same object is the same.
    return first.data_ptr() != 0 and all(
        t.data_ptr() == first.data_ptr()
        and t.shape == first.shape
        and t.stride() == first.stride()
        and t.device == first.device
        for t in tensors[1:]
    )


def merge(
    outputs: Sequence[tuple[list[torch.Tensor], Spec]],
    bounds: Sequence[tuple[int, int]],
    where: str,
) -> tuple[list[torch.Tensor], Spec, list[bool]]:
    """Join the outputs of the micro-batches of one slice.

    A tensor that every micro-batch returns as the same tensor (a value that was not
    split, passed through) is kept once; tensors whose first dimension is the
    micro-batch's length are concatenated in order.

    Args:
        outputs: Per micro-batch, its output tensors and spec.
        bounds: The micro-batches' ``(start, length)``.
        where: The slice, for messages.

    Returns:
        The joined tensors, the spec, and per tensor whether it was concatenated.

    Raises:
        offload.OffloadError: The micro-batches returned different non-tensor values or
            tensors that can be neither concatenated nor shared.
    """
    spec = outputs[0][1]
    for _, other in outputs[1:]:
        if not spec.same_values(other):
            raise OffloadError(
                f"offload: the micro-batches of {where} returned different non-tensor values "
                f"({spec.args + spec.kwargs!r} and {other.args + other.kwargs!r}); with "
                "num_microbatches > 1 every value a slice returns that is not a batch tensor "
                "must be the same for every micro-batch. Use num_microbatches=1."
            )
    merged: list[torch.Tensor] = []
    concatenated: list[bool] = []
    for position in range(spec.count):
        column = [tensors[position] for tensors, _ in outputs]
        if _same_view(column):
            merged.append(column[0])
            concatenated.append(False)
            continue
        if not all(
            t.dim() > 0 and t.shape[0] == length
            for t, (_, length) in zip(column, bounds, strict=True)
        ):
            shapes = [tuple(t.shape) for t in column]
            raise OffloadError(
                f"offload: {where} returned tensor {position} with shapes {shapes} for micro-"
                f"batches of {[length for _, length in bounds]} samples; with "
                "num_microbatches > 1 every tensor a slice returns must have the batch as "
                "its first dimension (or be an input passed through unchanged). Use "
                "num_microbatches=1 for this model."
            )
        merged.append(torch.cat(column) if len(column) > 1 else column[0])
        concatenated.append(True)
    return merged, spec, concatenated
