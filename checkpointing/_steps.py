"""One training step of a model, as the planner and the saved-tensor grain run it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from accel import Accelerator

__all__ = [
    "backward",
    "call_model",
    "dropping_saved",
    "require_grad",
    "tensors_of",
    "untouched",
]


def tensors_of(value: Any) -> list[torch.Tensor]:
    leaves, _ = tree_flatten(value)
    if isinstance(value, dict) and not leaves:  # dict subclasses pytree does not know
        leaves, _ = tree_flatten(dict(value))
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


@contextmanager
def untouched(model: nn.Module, backend: Accelerator) -> Iterator[None]:
    """Put gradients, buffers and generator states back as they were."""
    grads = {param: param.grad for param in model.parameters()}
    buffers = [(buffer, buffer.detach().clone()) for buffer in model.buffers()]
    try:
        with backend.fork_rng():
            for param in grads:
                param.grad = None
            yield
    finally:
        with torch.no_grad():
            for buffer, value in buffers:
                buffer.copy_(value)
        for param, grad in grads.items():
            param.grad = grad


def require_grad(output: Any) -> list[torch.Tensor]:
    """The outputs that require grad (raises if none does: there is nothing to plan)."""
    outputs = [t for t in tensors_of(output) if t.requires_grad]
    if not outputs:
        raise ValueError(
            "checkpointing: no output of the model requires grad for example_inputs, so "
            "there is no backward to plan for. Pass inputs of a training step, with "
            "the model's parameters requiring grad and grad mode enabled."
        )
    return outputs


def backward(output: Any) -> None:
    outputs = require_grad(output)
    torch.autograd.backward(outputs, [torch.ones_like(t) for t in outputs])


class _Dropped:
    """What a profiled forward stores in place of a saved tensor: nothing."""

    def __repr__(self) -> str:
        return "<dropped saved tensor>"


DROPPED = _Dropped()


def _refuse_backward(packed: Any) -> torch.Tensor:
    raise RuntimeError(
        "checkpointing: backward through a profiling forward, whose saved tensors were "
        "not kept. This is a bug in the planner; please report it."
    )


def dropping_saved(
    record: Any = None,
) -> torch.autograd.graph.saved_tensors_hooks:
    """Saved-tensor hooks that keep nothing: the forward holds no activations.

    ``record(tensor)`` (if given) sees each tensor autograd would save. The profile's
    forwards run under these hooks, so that planning never holds the plain step's
    activations, which are what the budget is for.
    """

    def pack(tensor: torch.Tensor) -> Any:
        if record is not None:
            record(tensor)
        return DROPPED

    return torch.autograd.graph.saved_tensors_hooks(pack, _refuse_backward)


def call_model(model: nn.Module, example_inputs: Any) -> Any:
    if isinstance(example_inputs, dict):
        return model(**example_inputs)
    return model(*example_inputs)
