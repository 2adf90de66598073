"""``PerCallWrapper``: a module called several times per step, checkpointed call by call.

A layer shared across depths (ALBERT, looped and recurrent-depth transformers) runs
several times in one forward. A plan may checkpoint some of its calls and not others,
or each at another grain. The wrapper counts the calls of each forward and hands the
k-th to its own wrapper (a :class:`CheckpointWrapper`, a selective or a saved-tensor
one), or runs the module plainly. The count starts again at every forward of the
model (:func:`count_calls_per_forward` installs the root's hook). A recomputation
(:func:`is_recomputing`) runs the module plainly and counts nothing: a call inside a
recomputed region belongs to a region the plan checkpointed whole.

*Calls inside a planned region.* Where a call the plan wraps (ALBERT's layer group,
say, checkpointed whole) runs calls of another per-call module (the layer's
activation, planned call by call), those inner calls run plainly and are not counted:
the outer wrapper marks the inner one as *inside* for the length of its call
(:meth:`PerCallWrapper.enclose`), and the inner one counts only the calls it makes
outside such regions. So no wrapper changes its own state inside a checkpointed region,
where ``torch.compile`` traces the region as one operator and would break the graph on
any change of Python state.
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
    """Runs the k-th counted call of ``module`` in each forward through ``variants[k]``.

    Args:
        module: The shared module.
        variants: For each counted call of a forward, the wrapper around ``module``
            that runs it, or ``None`` to run it plainly. Calls past the end run plainly.
    """

    def __init__(self, module: nn.Module, variants: Sequence[nn.Module | None]) -> None:
        super().__init__(module)
        # Not registered as submodules: each wraps ``module``, which is registered once.
        self.__dict__["_variants"] = tuple(variants)
        self.__dict__["_encloses"] = tuple(() for _ in variants)
        self.__dict__["_count"] = 0
        self.__dict__["_inside"] = 0  # the planned regions this module now runs in

    @property
    def variants(self) -> tuple[nn.Module | None, ...]:
        """The wrapper for each counted call of a forward (``None``: plain)."""
        variants: tuple[nn.Module | None, ...] = self.__dict__["_variants"]
        return variants

    def enclose(self, call: int, inner: Sequence[PerCallWrapper]) -> None:
        """Mark ``inner`` as inside a planned region while counted call ``call`` runs.

        Args:
            call: A counted call of this wrapper's module that has a variant.
            inner: The per-call wrappers whose module's calls that call makes.

        Raises:
            ValueError: If ``call`` has no variant (it is no planned region).
        """
        if not 0 <= call < len(self.variants) or self.variants[call] is None:
            raise ValueError(
                f"checkpointing: call {call} of this module is not planned, so it cannot "
                "enclose the calls of another module. Apply a plan made by "
                "plan_checkpointing."
            )
        encloses = list(self.__dict__["_encloses"])
        encloses[call] = tuple(inner)
        self.__dict__["_encloses"] = tuple(encloses)

    def reset(self) -> None:
        """Count from the first call again (a new forward of the model)."""
        self.__dict__["_count"] = 0
        self.__dict__["_inside"] = 0

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run this call of the module through its variant."""
        if self.__dict__["_inside"] or is_recomputing() or not torch.is_grad_enabled():
            return self.module(*args, **kwargs)
        call = self.__dict__["_count"]
        self.__dict__["_count"] = call + 1
        variants = self.variants
        variant = variants[call] if call < len(variants) else None
        if variant is None:
            return self.module(*args, **kwargs)
        inner: tuple[PerCallWrapper, ...] = self.__dict__["_encloses"][call]
        for wrapper in inner:
            wrapper.__dict__["_inside"] += 1
        # No try/finally (dynamo traces this method): the next forward's reset clears
        # the marks a failed call leaves.
        out = variant(*args, **kwargs)
        for wrapper in inner:
            wrapper.__dict__["_inside"] -= 1
        return out

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
