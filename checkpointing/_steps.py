"""One training step of a model, as the planner runs it: call, backward, time, restore."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from accel import Accelerator

__all__ = ["backward", "call_model", "tensors_of", "timed_step", "untouched"]


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


def backward(output: Any) -> None:
    outputs = [t for t in tensors_of(output) if t.requires_grad]
    if not outputs:
        raise ValueError(
            "checkpointing: no output of the model requires grad for example_inputs, so "
            "there is no backward to plan for. Pass inputs of a training step, with "
            "the model's parameters requiring grad and grad mode enabled."
        )
    torch.autograd.backward(outputs, [torch.ones_like(t) for t in outputs])


def call_model(model: nn.Module, example_inputs: Any) -> Any:
    if isinstance(example_inputs, dict):
        return model(**example_inputs)
    return model(*example_inputs)


def timed_step(model: nn.Module, example_inputs: Any, backend: Accelerator) -> tuple[float, float]:
    backend.synchronize()
    start = time.perf_counter()
    output = call_model(model, example_inputs)
    backend.mark_step()
    backend.synchronize()
    middle = time.perf_counter()
    backward(output)
    backend.mark_step()
    backend.synchronize()
    return time.perf_counter() - start, middle - start
