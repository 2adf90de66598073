"""What a plan was made for, and the checks that a model and inputs are that.

A plan records the planned model's *structure* (each module's name and class, then each
parameter's and buffer's name, dtype and shape, in definition order) and its inputs'
shapes and dtypes; :meth:`CheckpointPlan.apply` checks both before wrapping anything,
and refuses with a sentence that names the first difference.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from .._wrapper import CheckpointWrapper

__all__ = ["check_inputs", "check_model", "inputs_of", "structure_of"]


def structure_of(model: nn.Module) -> tuple[str, ...]:
    """The model's structure as a plan records it (see the module docstring)."""
    lines = [f"{name or '(model)'}: {type(module).__qualname__}" for name, module in _plain(model)]
    for name, tensor in (*model.named_parameters(), *model.named_buffers()):
        dtype = str(tensor.dtype).removeprefix("torch.")
        lines.append(f"{name}: {dtype}{list(tensor.shape)}")
    return tuple(lines)


def _plain(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Named modules with checkpoint wrappers looked through (their names kept plain)."""
    found = []
    for name, module in model.named_modules():
        if isinstance(module, CheckpointWrapper):
            continue
        found.append((name.replace("._checkpoint_wrapped_module", ""), module))
    return found


def inputs_of(value: Any) -> tuple[str, ...]:
    """A step's inputs as a plan records them: ``"float32[4, 192]"`` per tensor, else a type."""
    leaves, _ = tree_flatten(value)
    described = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            dtype = str(leaf.dtype).removeprefix("torch.")
            described.append(f"{dtype}{list(leaf.shape)}")
        else:
            described.append(type(leaf).__name__)
    return tuple(described)


def check_model(structure: tuple[str, ...], model: nn.Module) -> None:
    """Raise ``ValueError`` naming the first difference between ``model`` and ``structure``."""
    found = structure_of(model)
    if found == structure:
        return
    pairs = zip(structure, found, strict=False)
    first = next(((want, got) for want, got in pairs if want != got), None)
    if first is None:  # one is a prefix of the other
        longer = len(structure) > len(found)
        first = (structure[len(found)], "nothing") if longer else ("nothing", found[len(structure)])
    raise ValueError(
        "checkpointing: this model is not built like the one the plan was made for: the "
        f"plan has {first[0]!r} where the model has {first[1]!r}. Apply a plan to the "
        "model it was made for (or one built the same way), or make a new plan for this "
        "model."
    )


def check_inputs(recorded: tuple[str, ...], example_inputs: Any) -> None:
    """Raise ``ValueError`` unless ``example_inputs`` are shaped like ``recorded``."""
    given = inputs_of(example_inputs)
    if given != recorded:
        raise ValueError(
            "checkpointing: these inputs are not shaped like the ones the plan was made "
            f"for ({', '.join(given)} against {', '.join(recorded)}); its memory and time "
            "estimates hold for those shapes only. Make a new plan for these inputs."
        )
