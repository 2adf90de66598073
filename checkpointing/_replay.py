"""Operator calls recorded so that they can run again: tensor geometry and references.

The saved-tensor grain (:mod:`._saved_grain`) recomputes a dropped activation by
calling again the aten operators that produced it, on tensors it can still reach (the
module's inputs, parameters and buffers, and activations autograd keeps anyway). The
profile records each call's arguments as a *template*: tensors are replaced by a
:class:`Ref` naming where the tensor came from and its exact view of that storage
(:class:`Geometry`), other arguments are kept as they were. Running a template again
gives the forward's values bit for bit when the operator is deterministic, does not
draw random numbers and writes nothing in place (:func:`replayable`): it is the same
kernel on the same bytes with the same strides.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch.utils._pytree import TreeSpec, tree_flatten, tree_map, tree_unflatten

__all__ = [
    "Geometry",
    "Ref",
    "counted",
    "operator_label",
    "replay_arguments",
    "replayable",
    "resolve",
    "template_of",
]


@dataclass(frozen=True)
class Geometry:
    """How a tensor views its storage: shape, strides, offset, dtype and storage size."""

    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype
    storage_bytes: int

    @classmethod
    def of(cls, tensor: torch.Tensor) -> Geometry:
        return cls(
            tuple(tensor.shape),
            tuple(tensor.stride()),
            int(tensor.storage_offset()),
            tensor.dtype,
            tensor.untyped_storage().nbytes(),
        )

    def matches(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is this view of a storage of this size."""
        return (
            tensor.dtype == self.dtype
            and tuple(tensor.shape) == self.size
            and tuple(tensor.stride()) == self.stride
            and tensor.storage_offset() == self.offset
            and tensor.untyped_storage().nbytes() == self.storage_bytes
        )

    def view(self, base: torch.Tensor) -> torch.Tensor:
        """This view of ``base``'s storage (``base`` may be any tensor on it)."""
        if base.untyped_storage().nbytes() != self.storage_bytes or base.dtype != self.dtype:
            raise RuntimeError(
                "checkpointing: a recomputed tensor does not have the storage its forward "
                f"had ({base.untyped_storage().nbytes()} bytes of {base.dtype}, expected "
                f"{self.storage_bytes} of {self.dtype}). Make a new plan for this model."
            )
        same = base.storage_offset() == self.offset and base.stride() == self.stride
        if same and base.shape == self.size:
            return base  # already this view: no new tensor needed
        return base.as_strided(self.size, self.stride, self.offset)


@dataclass(frozen=True)
class Ref:
    """Where a recorded argument came from: ``("storage", index)`` or ``("state", name)``.

    ``index`` numbers the storages the profile saw created or received; ``name`` is a
    parameter's or buffer's qualified name.
    """

    kind: str
    key: int | str
    geometry: Geometry


def template_of(value: Any, identify: Callable[[torch.Tensor], Ref | None]) -> tuple[Any, bool]:
    """``value`` with every tensor replaced by its :class:`Ref`; and whether all had one."""
    complete = True

    def replace(leaf: Any) -> Any:
        nonlocal complete
        if not isinstance(leaf, torch.Tensor):
            return leaf
        ref = identify(leaf)
        complete = complete and ref is not None
        return ref

    return tree_map(replace, value), complete


def resolve(template: Any, lookup: Callable[[Ref], torch.Tensor]) -> Any:
    """The arguments of a recorded call, each :class:`Ref` replaced by ``lookup(ref)``."""
    return tree_map(lambda leaf: lookup(leaf) if isinstance(leaf, Ref) else leaf, template)


class FlatTemplate(NamedTuple):
    """A template flattened once: its leaves, its structure, where its :class:`Ref` are."""

    leaves: list[Any]
    spec: TreeSpec
    refs: tuple[int, ...]


def flat_template(template: Any) -> FlatTemplate:
    """``template`` flattened, for :func:`resolve_flat` to fill again and again."""
    leaves, spec = tree_flatten(template)
    refs = tuple(i for i, leaf in enumerate(leaves) if isinstance(leaf, Ref))
    return FlatTemplate(leaves, spec, refs)


def resolve_flat(flat: FlatTemplate, lookup: Callable[[Ref], torch.Tensor]) -> Any:
    """:func:`resolve` of a flattened template."""
    leaves = list(flat.leaves)
    for i in flat.refs:
        leaves[i] = lookup(leaves[i])
    return tree_unflatten(leaves, flat.spec)


_UNSAFE_TAGS = tuple(
    tag
    for tag in (
        getattr(torch.Tag, "nondeterministic_seeded", None),
        getattr(torch.Tag, "nondeterministic_bitwise", None),
        getattr(torch.Tag, "dynamic_output_shape", None),
        getattr(torch.Tag, "data_dependent_output", None),
    )
    if tag is not None
)


# Batch norm kernels that update the running statistics in place in training although
# their schema marks no argument as written (``_native_batch_norm_legit`` and
# ``_batch_norm_with_update`` mark theirs): run again, they would update them twice.
_UNMARKED_WRITES = frozenset(
    {"aten::native_batch_norm", "aten::cudnn_batch_norm", "aten::miopen_batch_norm"}
)


def replayable(func: Any) -> bool:
    """Whether calling the aten operator ``func`` again gives the same bytes.

    It must draw no random numbers, be bitwise deterministic, write nothing in place
    (its schema's ``a!``, or running statistics, which some batch norm kernels write
    unmarked), return no view of an argument and not leave its output uninitialised
    (``empty``, ``empty_like``: their bytes are whatever the allocator hands out).
    """
    schema = getattr(func, "_schema", None)
    if schema is None or any(tag in func.tags for tag in _UNSAFE_TAGS):
        return False
    if schema.name in _UNMARKED_WRITES:
        return False
    if "empty" in schema.name:
        return False
    aliased = [*schema.arguments, *schema.returns]
    return all(argument.alias_info is None for argument in aliased)


def replay_arguments(func: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
    """Arguments that call ``func`` again for the same outputs, or ``None`` if none do.

    A :func:`replayable` call's own. A host batch norm kernel in training
    (``aten::native_batch_norm``, which writes the running statistics unmarked) runs
    again with ``None`` for them: it computes the batch's mean and variance as before
    and updates nothing, and the kernel normalises with the statistics it computed
    either way, so the output is the same bytes (a planned call's checked first call
    compares it with what autograd saved, as it does every recipe's). In evaluation it
    only reads them: its own arguments.
    """
    if replayable(func):
        return args, kwargs
    schema = getattr(func, "_schema", None)
    if schema is None or schema.name != "aten::native_batch_norm" or kwargs:
        return None
    if len(args) != 8 or not isinstance(args[5], bool):
        return None
    if not args[5]:
        return args, kwargs
    return (*args[:3], None, None, *args[5:]), kwargs


def operator_label(name: str) -> str:
    """``aten.addmm.default`` -> ``addmm``: an operator's name in a plan's table."""
    parts = name.split(".")
    return parts[1] if len(parts) > 2 else name


def counted(labels: Iterable[str]) -> str:
    """``addmm x3, bernoulli_``: labels in first-seen order, repeats counted."""
    counts = Counter(labels)
    return ", ".join(f"{label} x{count}" if count > 1 else label for label, count in counts.items())
