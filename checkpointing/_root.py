"""Checkpointing a model as a whole: the plan's decision for the root module.

A plan wraps a submodule by putting a wrapper in its parent's place; the root has no
parent. Where the root's own operators save activations (a model that is one
childless layer, or whose forward computes outside its submodules) the planner may
checkpoint the root whole: :func:`checkpoint_root` then sets the model's own
``forward`` (an instance attribute, read before the class's) to a
:class:`CheckpointWrapper` around :class:`OwnForward`, which calls the class's
forward. The model stays the same object with the same parameters, hooks and
``state_dict`` keys; ``copy.deepcopy`` copies the wrapper with it.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from accel import Accelerator

from ._wrapper import CheckpointWrapper, checkpoint_wrapper

__all__ = ["OwnForward", "checkpoint_root", "root_checkpointed", "uncheckpoint_root"]


class OwnForward(nn.Module):
    """The class's ``forward`` of a model, as a module the checkpoint can call.

    The model is held outside ``_modules``, so that it is no submodule of its own.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.__dict__["model"] = model

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The model's class forward on ``args`` and ``kwargs``."""
        model = self.__dict__["model"]
        return type(model).forward(model, *args, **kwargs)


def root_checkpointed(model: nn.Module) -> bool:
    """Whether :func:`checkpoint_root` already checkpointed ``model``."""
    return isinstance(model.__dict__.get("forward"), CheckpointWrapper)


def checkpoint_root(
    model: nn.Module, *, preserve_rng_state: bool = True, backend: Accelerator | None = None
) -> None:
    """Run ``model``'s forward as one checkpoint from now on (see the module docstring)."""
    model.__dict__["forward"] = checkpoint_wrapper(
        OwnForward(model), preserve_rng_state=preserve_rng_state, backend=backend
    )


def uncheckpoint_root(model: nn.Module) -> None:
    """Undo :func:`checkpoint_root`: the class's forward runs plainly again."""
    if root_checkpointed(model):
        del model.__dict__["forward"]
