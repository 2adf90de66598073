"""``PerCallWrapper``: a module called several times per step, checkpointed call by call.

A layer shared across depths (ALBERT, looped and recurrent-depth transformers) runs
several times in one forward. A plan may checkpoint some of its calls and not others,
or each at another grain. The wrapper counts the calls of each forward and hands the
k-th to its own wrapper (a :class:`CheckpointWrapper`, a selective or a saved-tensor
one), or runs the module plainly. The count starts again at every forward of the
model (:func:`count_calls_per_forward` installs the root's hook). A recomputation
(:func:`is_recomputing`) runs the module plainly and counts nothing: a call inside a
recomputed region belongs to a region the plan checkpointed whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ._state import is_recomputing
from ._wrapper import CheckpointWrapper

__all__ = ["PerCallWrapper", "count_calls_per_forward"]


class PerCallWrapper(CheckpointWrapper):
    """Runs the k-th call of ``module`` in each forward through ``variants[k]``.

    Args:
        module: The shared module.
        variants: For each call of a forward, the wrapper around ``module`` that runs
            it, or ``None`` to run it plainly. Calls past the end run plainly.
    """

    def __init__(self, module: nn.Module, variants: Sequence[nn.Module | None]) -> None:
        super().__init__(module)
        # Not registered as submodules: each wraps ``module``, which is registered once.
        self.__dict__["_variants"] = tuple(variants)
        self.__dict__["_count"] = 0

    @property
    def variants(self) -> tuple[nn.Module | None, ...]:
        """The wrapper for each call of a forward (``None``: plain)."""
        variants: tuple[nn.Module | None, ...] = self.__dict__["_variants"]
        return variants

    def reset(self) -> None:
        """Count from the first call again (a new forward of the model)."""
        self.__dict__["_count"] = 0

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run this call of the module through its variant."""
        if is_recomputing() or not torch.is_grad_enabled():
            return self.module(*args, **kwargs)
        call = self.__dict__["_count"]
        self.__dict__["_count"] = call + 1
        variants = self.variants
        variant = variants[call] if call < len(variants) else None
        return self.module(*args, **kwargs) if variant is None else variant(*args, **kwargs)

    def extra_repr(self) -> str:
        planned = sum(variant is not None for variant in self.variants)
        return f"{planned} of {len(self.variants)} calls per forward checkpointed"


def _reset(model: nn.Module, args: Any) -> None:
    for module in model.modules():
        if isinstance(module, PerCallWrapper):
            module.reset()


def count_calls_per_forward(model: nn.Module) -> None:
    """Make every forward of ``model`` restart its :class:`PerCallWrapper`s' counts."""
    if not getattr(model, "_accel_per_call_hook", False):
        model.register_forward_pre_hook(_reset)
        model.__dict__["_accel_per_call_hook"] = True
