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
    "SavedPerCall",
    "backward",
    "call_model",
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


class _Held:
    """What a real profiled forward stores for a saved tensor: the tensor, until released."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor: torch.Tensor | None = tensor


def _unpack(held: _Held) -> torch.Tensor:
    if held.tensor is None:
        raise RuntimeError(
            "checkpointing: the model's forward ran a backward through a tensor saved in "
            "a module call that had already returned, while the planner profiled it on "
            "real tensors. That profile keeps what autograd saves only until the module "
            "call that saved it returns, so that planning never holds the step's "
            "activations: a forward may take gradients within one module call, but not "
            "through what an earlier call computed."
        )
    return held.tensor


class SavedPerCall:
    """Saved-tensor hooks for a real forward that keep each tensor only while needed.

    A module's forward may run a backward of its own (a layer that takes gradients
    inside its forward, or a scan-based ``nn.GRU`` that a backend puts in place of
    torch's, which traces its step with AOTAutograd and runs that trace's backward to
    capture it), so a saved tensor cannot be dropped at once. Each is kept until the
    module call running when autograd saved it returns (:meth:`enter` and :meth:`leave`
    bracket every call), then released: the forward holds what the calls still running
    saved with their own operators, never the whole step's activations, which are what
    the budget is for.

    Args:
        record: If given, ``record(tensor)`` sees each tensor autograd saves.
    """

    def __init__(self, record: Any = None) -> None:
        self.record = record
        self.open: list[list[_Held]] = [[]]  # per running call; the step's own first

    def _pack(self, tensor: torch.Tensor) -> _Held:
        if self.record is not None:
            self.record(tensor)
        held = _Held(tensor)
        self.open[-1].append(held)
        return held

    def enter(self) -> None:
        """A module call starts: what it saves is kept until :meth:`leave`."""
        self.open.append([])

    def leave(self) -> None:
        """The latest module call returned: release what it saved."""
        if len(self.open) > 1:
            for held in self.open.pop():
                held.tensor = None

    @contextmanager
    def hooks(self) -> Iterator[None]:
        """The hooks, for one forward; everything still kept is released on exit."""
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack):
                yield
        finally:
            for held in (held for call in self.open for held in call):
                held.tensor = None
            self.open = [[]]


def call_model(model: nn.Module, example_inputs: Any) -> Any:
    if isinstance(example_inputs, dict):
        return model(**example_inputs)
    return model(*example_inputs)
