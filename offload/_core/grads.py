"""Where gradients go: fixed device memory, written in place so that backward allocates none.

Autograd computes a linear layer's weight gradient into a fresh tensor, the matrix
product of the output gradient and the input, and only then adds it into ``.grad``. On
a device under a memory cap that is one weight-sized allocation and free per layer and
micro-batch, which a caching allocator can serve only by freeing its cache and retrying.

A :class:`GradientSink` knows, for each offloaded tensor the layers compute with, where
its gradient goes: a :class:`Destination`, the tensor's place in the wrapper's fixed
gradient memory, asked of the tensor's :class:`Target` when backward needs it. The layers
that write there are in :mod:`offload._core.intercept`; :meth:`GradientSink.write` is
how they write.

A destination that holds nothing yet is overwritten. A later contribution (another
micro-batch, a tied weight's other use, a gradient left from an earlier backward) goes
into one scratch tensor per dtype, as large as the largest tracked tensor and allocated
once, and is then added in place: autograd's own two roundings (a fresh product, an
in-place add), so results are the plain model's bit for bit where autograd would add the
same two tensors, in the parameter's dtype, as the plain model accumulates them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch.utils.weak import WeakIdKeyDictionary

from accel import _compat

from .transfer import expanded_zeros

__all__ = ["Destination", "Destinations", "GradientSink", "Like", "Target", "standalone"]


@dataclass
class Destination:
    """Where one tensor's gradient is written: ``tensor``, laid out as the parameter.

    ``empty_at`` is the version ``tensor`` had when it held nothing (zeros, or memory
    whose contents do not matter); while the version has not moved, the next write
    replaces the contents instead of adding to them.
    """

    tensor: torch.Tensor
    empty_at: int | None = field(default=None)
    #: The version the last write left (see :meth:`GradientSink.write`).
    handed_at: int | None = field(default=None)

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
    """Where one wrapper's gradients go, and how they are written there.

    A tracked tensor that is a leaf (a parameter whose ``.data`` was swapped) must have
    its destination as its ``.grad``: after writing there, backward hands the leaf no
    gradient, and its ``AccumulateGrad`` still runs its post-accumulate-grad hooks (where
    a release skips them without a gradient, backward hands it zeros that take no
    memory, which ``AccumulateGrad`` adds in place). A tracked copy gets nothing: its
    producer reads the destination.
    """

    def __init__(self) -> None:
        # Asked now, never inside a backward (the probe runs a backward of its own).
        self._hooks_without_gradient = _compat.post_accumulate_hooks_run_without_gradient()
        self._targets: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._largest: dict[torch.dtype, int] = {}
        self._scratch: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}

    @classmethod
    def of_parameters(
        cls, parameters: Sequence[torch.Tensor], destinations: Destinations
    ) -> GradientSink:
        """A sink for parameters whose ``.data`` is swapped.

        Each trainable one's gradient goes to its destination in ``destinations``, open
        while it is on the device for backward.
        """
        sink = cls()
        sink.reserve(parameters)
        for parameter in parameters:
            if parameter.requires_grad:
                sink.track(parameter, destinations.target(id(parameter)))
        return sink

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

    # Writing ----------------------------------------------------------------------------

    def write(
        self, destination: Destination, kernel: Callable[[torch.Tensor], object], like: Like
    ) -> torch.Tensor | None:
        """Put what ``kernel(out)`` computes into ``out`` into ``destination``.

        Straight in when the destination is empty; otherwise into the scratch memory,
        then added in place.

        Returns:
            What backward hands autograd for the tensor ``like`` describes: nothing, or
            for a leaf where a release runs its hooks only on a gradient, zeros that take
            no memory (once per ``AccumulateGrad`` run: while they wait in autograd's
            buffer, the destination's version stays where this call left it).
        """
        before = destination.tensor._version
        if destination.is_empty:
            kernel(destination.tensor)
        else:
            scratch = self._scratch_like(destination.tensor)
            kernel(scratch)
            destination.tensor.add_(scratch)
        waiting = destination.handed_at == before
        destination.handed_at = destination.tensor._version
        if not like.leaf or self._hooks_without_gradient or waiting:
            return None
        return expanded_zeros(like.shape, like.dtype, like.device)

    def _scratch_like(self, tensor: torch.Tensor) -> torch.Tensor:
        key = (tensor.dtype, tensor.device)
        flat = self._scratch.get(key)
        if flat is None or flat.numel() < tensor.numel():
            numel = max(self._largest.get(tensor.dtype, 0), tensor.numel())
            flat = torch.empty(numel, dtype=tensor.dtype, device=tensor.device)
            self._scratch[key] = flat
        return flat[: tensor.numel()].view(tensor.shape)


@dataclass(frozen=True)
class Like:
    """What backward needs to know of a tracked tensor, without holding its memory."""

    shape: torch.Size
    dtype: torch.dtype
    device: torch.device
    leaf: bool

    @classmethod
    def of(cls, tensor: torch.Tensor) -> Like:
        return cls(tensor.shape, tensor.dtype, tensor.device, tensor.grad_fn is None)
