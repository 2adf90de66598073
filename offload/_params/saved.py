"""Tensors autograd saves during an offloaded forward, and the user's own saved-tensor hooks.

A tensor saved from a unit's device parameters (a weight, or a view of one, such as
``weight.t()`` in a linear layer) would keep the unit's device memory alive until
backward. :class:`SavedTensors` replaces it with an :class:`Alias` (which unit, dtype,
size, stride and offset) and rebuilds the view from the unit's device copy when
backward unpacks it, loading the unit if it is not there.

Every other tensor goes to the saved-tensor hooks that were active when the root's
forward began (``torch.autograd.graph.save_on_cpu()``, activation compression...), so
those keep working around an offloaded model. torch 2.4 cannot report those hooks
(:data:`accel._compat.SAVED_TENSORS_HOOKS_VISIBLE`): there, tensors are kept as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from accel import _compat

__all__ = ["Alias", "SavedTensors"]


@dataclass(frozen=True)
class Alias:
    """A saved tensor that was a view of a unit's device parameters."""

    unit: int
    dtype: torch.dtype
    size: torch.Size
    stride: tuple[int, ...]
    offset: int


@dataclass(frozen=True)
class _Outer:
    """What the user's pack hook returned, and the unpack hook that reads it."""

    packed: Any
    unpack: Callable[[Any], torch.Tensor]


class SavedTensors:
    """The saved-tensor hooks an offloaded forward runs under.

    Args:
        device: The compute device (only its tensors can alias parameters).
        owner: Maps a device storage's data pointer to its unit and dtype.
        view: Returns the device view an :class:`Alias` describes (loading its unit).
    """

    def __init__(
        self,
        device: torch.device,
        owner: dict[int, tuple[int, torch.dtype]],
        view: Callable[[Alias], torch.Tensor],
    ) -> None:
        self._device = device
        self._owner = owner
        self._view = view
        self._context: Any = None

    def enter(self) -> None:
        """Start saving through these hooks, on top of the user's (if any)."""
        outer = _compat.current_saved_tensors_hooks()
        pack, unpack = self._pack, self._unpack
        if outer is not None:
            outer_pack, outer_unpack = outer

            def pack(tensor: torch.Tensor) -> Any:
                saved = self._pack(tensor)
                if saved is not tensor:
                    return saved
                return _Outer(outer_pack(tensor), outer_unpack)

        self._context = torch.autograd.graph.saved_tensors_hooks(pack, unpack)
        self._context.__enter__()

    def exit(self) -> None:
        """Stop saving through these hooks (a no-op when not entered)."""
        context, self._context = self._context, None
        if context is not None:
            context.__exit__(None, None, None)

    def _pack(self, tensor: torch.Tensor) -> Any:
        if tensor.device != self._device or not self._owner:
            return tensor
        owner = self._owner.get(tensor.untyped_storage().data_ptr())
        if owner is None:
            return tensor
        offset = int(tensor.storage_offset())
        return Alias(owner[0], owner[1], tensor.shape, tensor.stride(), offset)

    def _unpack(self, saved: Any) -> torch.Tensor:
        if isinstance(saved, _Outer):
            return saved.unpack(saved.packed)
        if isinstance(saved, Alias):
            return self._view(saved)
        return saved  # type: ignore[no-any-return]
