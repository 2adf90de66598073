"""The reentrant checkpoint: an autograd Function that reruns the function in its backward.

Forward keeps the tensor inputs (``save_for_backward``, or host copies with
``offload``) and the non-tensor inputs aside, captures the autocast and generator
states through the backend, and runs the function without building a graph. Backward
puts the inputs and the incoming gradients behind the backend's recompute barrier,
replays those states, recomputes the function with grad enabled from detached inputs,
and back-propagates through the recomputed graph with a nested ("reentrant") call to
:func:`torch.autograd.backward`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ._offload import HostCopy, restore, stash, wait_for_copies
from ._state import ForwardState, Options, recomputation

__all__ = ["INVALID_USE_MESSAGE", "NO_OUTPUT_GRAD_MESSAGE", "run_reentrant"]

# torch.utils.checkpoint's wording, kept verbatim so code matching on it keeps working.
INVALID_USE_MESSAGE = (
    "When use_reentrant=True, torch.utils.checkpoint is incompatible"
    " with .grad() or passing an `inputs` parameter to .backward()."
    " To resolve this error, you can either set use_reentrant=False,"
    " or call .backward() without passing the `inputs` argument."
)
NO_OUTPUT_GRAD_MESSAGE = "none of output has requires_grad=True, this checkpoint() is not necessary"


def _detached(value: Any) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    return value.detach().requires_grad_(value.requires_grad)


class _ReentrantCheckpoint(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, function: Callable[..., Any], options: Options, *args: Any) -> Any:
        state = ForwardState.capture(options.backend, options.preserve_rng_state, args)
        ctx.function = function
        ctx.options = options
        ctx.state = state
        ctx.inputs = [None if isinstance(arg, torch.Tensor) else arg for arg in args]
        saved_indices: list[int] = []
        saved: list[torch.Tensor] = []
        host_copies: dict[int, HostCopy] = {}
        for index, arg in enumerate(args):
            if not isinstance(arg, torch.Tensor):
                continue
            item = stash(arg, options.backend) if options.offload else arg
            if isinstance(item, HostCopy):
                host_copies[index] = item
            else:
                saved_indices.append(index)
                saved.append(arg)
        ctx.saved_indices = saved_indices
        ctx.host_copies = host_copies
        ctx.save_for_backward(*saved)
        # Outputs that backward does not reach get None, not zeros, so that the
        # recomputed graph is back-propagated only where the plain graph would be.
        ctx.set_materialize_grads(False)
        try:
            with torch.no_grad():
                outputs = function(*args)
        except BaseException:
            state.restore_rng()
            raise
        finally:
            wait_for_copies(list(host_copies.values()), options.backend)
        return outputs

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Any) -> tuple[Any, ...]:
        if not torch.autograd._is_checkpoint_valid():
            raise RuntimeError(INVALID_USE_MESSAGE)
        options: Options = ctx.options
        inputs = list(ctx.inputs)
        for index, tensor in zip(ctx.saved_indices, ctx.saved_tensors, strict=True):
            inputs[index] = tensor
        for index, host_copy in ctx.host_copies.items():
            inputs[index] = restore(host_copy, options.backend)
        detached = tuple(_detached(value) for value in inputs)
        # The incoming gradients join the barrier so that a lazy device also cannot
        # schedule the recomputation before backward reaches this checkpoint.
        with recomputation(ctx.state, (*detached, *grad_outputs)):
            outputs = ctx.function(*detached)
        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)
        differentiable = [
            (output, grad)
            for output, grad in zip(outputs, grad_outputs, strict=False)
            if isinstance(output, torch.Tensor) and output.requires_grad
        ]
        if not differentiable:
            raise RuntimeError(NO_OUTPUT_GRAD_MESSAGE)
        reached = [(output, grad) for output, grad in differentiable if grad is not None]
        if reached:
            torch.autograd.backward(
                [output for output, _ in reached], [grad for _, grad in reached]
            )
        input_grads = tuple(
            value.grad if isinstance(value, torch.Tensor) else None for value in detached
        )
        return (None, None, *input_grads)


def run_reentrant(function: Callable[..., Any], args: tuple[Any, ...], options: Options) -> Any:
    """Run ``function(*args)`` through the reentrant checkpoint Function."""
    return _ReentrantCheckpoint.apply(function, options, *args)
