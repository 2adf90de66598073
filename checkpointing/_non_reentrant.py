"""The non-reentrant checkpoint, built on ``torch.autograd.graph.saved_tensors_hooks``.

Forward runs the function with grad enabled, so autograd records its graph as usual,
but every tensor the graph saves for backward is replaced by an empty
:class:`_Holder`: the activations are not kept. The first time backward unpacks one
of them, the frame recomputes the function once (with the forward's generator and
autocast states, after ``mark_step``) and fills every holder still alive; each unpack
then hands over its tensor and forgets it, so recomputed activations are freed as
backward consumes them.

Because the real graph is the forward's, this variant works with
:func:`torch.autograd.grad`, ``backward(inputs=...)``, keyword arguments and partial
backward. Nested checkpoints work because a frame's inputs are saved through a no-op
autograd Function: inside an outer checkpoint they become the outer frame's saved
tensors and are themselves recomputed when needed.

Recomputation must save the same tensors in the same order as the forward; a
different count, shape, dtype or device raises :class:`CheckpointError`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from typing import Any

import torch

from ._errors import CheckpointError
from ._offload import HostCopy, restore, stash, wait_for_copies
from ._state import ForwardState, Options, recomputation

__all__ = ["DETERMINISM_CHECKS", "run_non_reentrant"]

DETERMINISM_CHECKS = ("default", "none")

ContextFn = Callable[[], tuple[AbstractContextManager[Any], AbstractContextManager[Any]]]
_Metadata = tuple[torch.Size, torch.dtype, torch.device]
_MISSING = object()

_ADVICE = (
    "The checkpointed function must run the same operations on the same shapes when it "
    "is recomputed for backward. Keep preserve_rng_state=True if it uses randomness, "
    "make any branch on global state or on tensor values take the same path both times "
    "(torch.use_deterministic_algorithms(True) helps with non-deterministic kernels), "
    'or pass determinism_check="none" to skip this check at your own risk.'
)


class _Holder:
    """Stands in a saved-tensor slot of the forward graph; holds the recomputed tensor."""

    __slots__ = ("__weakref__", "value")

    def __init__(self) -> None:
        self.value: torch.Tensor | None = None


class _SaveInputs(torch.autograd.Function):
    """Saves a frame's tensor inputs through whatever saved-tensor hooks are active."""

    @staticmethod
    def forward(ctx: Any, dummy: torch.Tensor, *tensors: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(*tensors)
        return torch.empty((0,))

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:  # pragma: no cover - never part of a graph
        raise CheckpointError(
            "checkpointing: internal error: the input saver of a checkpoint was "
            "back-propagated. Please report this with the code that triggered it."
        )


def _describe(metadata: _Metadata) -> str:
    shape, dtype, device = metadata
    return f"shape {tuple(shape)}, dtype {dtype}, device {device}"


def _name(function: Callable[..., Any]) -> str:
    name = getattr(function, "__qualname__", None) or type(function).__name__
    return str(name)


class _Frame:
    """One checkpointed call: how to rerun it, and the holders it must fill."""

    def __init__(
        self,
        function: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: Options,
        state: ForwardState,
        check: bool,
        recompute_context: AbstractContextManager[Any] | None,
    ) -> None:
        self.function = function
        self.options = options
        self.state = state
        self.check = check
        self.recompute_context = recompute_context
        self.keys = list(kwargs)
        values = [*args, *kwargs.values()]
        self.positional = len(args)
        self.layout: list[Any] = [
            None if isinstance(value, torch.Tensor) else value for value in values
        ]
        self.saved_indices: list[int] = []
        self.host_copies: dict[int, HostCopy] = {}
        saved: list[torch.Tensor] = []
        for index, value in enumerate(values):
            if not isinstance(value, torch.Tensor):
                continue
            item = stash(value, options.backend) if options.offload else value
            if isinstance(item, HostCopy):
                self.host_copies[index] = item
            else:
                self.saved_indices.append(index)
                saved.append(value)
        self.saver: Any = None
        if saved:
            dummy = torch.empty((0,), requires_grad=True)
            # The output is kept too: torch 2.4 frees a node's saved tensors with it.
            self.saver_output = _SaveInputs.apply(dummy, *saved)
            self.saver = self.saver_output.grad_fn
        self.holders: list[weakref.ReferenceType[_Holder]] = []
        self.metadata: list[_Metadata] = []

    # Forward -------------------------------------------------------------------------

    def pack(self, tensor: torch.Tensor) -> _Holder:
        holder = _Holder()
        self.holders.append(weakref.ref(holder))
        if self.check:
            self.metadata.append((tensor.shape, tensor.dtype, tensor.device))
        return holder

    def unpack(self, holder: _Holder) -> torch.Tensor:
        if holder.value is None:
            self.recompute()
        value = holder.value
        if value is None:
            # Only reachable with determinism_check="none": the count check would have
            # raised in recompute() otherwise.
            raise CheckpointError(
                f"checkpointing: recomputing {_name(self.function)} for backward saved "
                "fewer tensors than its forward, so a tensor backward needs is missing. "
                f"{_ADVICE}"
            )
        holder.value = None
        return value

    # Backward ------------------------------------------------------------------------

    def _inputs(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        values = list(self.layout)
        if self.saver is not None:
            for index, tensor in zip(self.saved_indices, self.saver.saved_tensors, strict=True):
                values[index] = tensor.detach().requires_grad_(tensor.requires_grad)
        for index, host_copy in self.host_copies.items():
            values[index] = restore(host_copy, self.options.backend)
        args = tuple(values[: self.positional])
        kwargs = dict(zip(self.keys, values[self.positional :], strict=True))
        return args, kwargs

    def recompute(self) -> None:
        """Rerun the function once and put each saved tensor in its live holder."""
        args, kwargs = self._inputs()
        counter = 0
        mismatches: list[str] = []

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            # Detached, so that neither the holder nor the recomputed graph keeps a
            # reference from a saved output back to its own node: that cycle runs
            # through C++ and the garbage collector cannot break it.
            tensor = tensor.detach() if tensor.requires_grad else tensor
            nonlocal counter
            index = counter
            counter += 1
            if index >= len(self.holders):
                return tensor
            if self.check and len(mismatches) < 3:
                expected = self.metadata[index]
                found = (tensor.shape, tensor.dtype, tensor.device)
                if found != expected:
                    mismatches.append(
                        f"saved tensor #{index} has {_describe(found)} in recomputation "
                        f"but had {_describe(expected)} in forward"
                    )
            holder = self.holders[index]()
            if holder is not None:
                holder.value = tensor
            return tensor

        def unpack(tensor: torch.Tensor) -> torch.Tensor:
            return tensor

        with ExitStack() as stack:
            stack.enter_context(recomputation(self.state))
            if self.recompute_context is not None:
                stack.enter_context(self.recompute_context)
            stack.enter_context(torch.autograd.graph.saved_tensors_hooks(pack, unpack))
            self.function(*args, **kwargs)
        if self.check and counter != len(self.holders):
            self._clear()
            raise CheckpointError(
                f"checkpointing: recomputing {_name(self.function)} for backward saved "
                f"{counter} tensors, but its forward saved {len(self.holders)}: the "
                f"recomputation does not match the forward. {_ADVICE}"
            )
        if mismatches:
            self._clear()
            raise CheckpointError(
                f"checkpointing: recomputing {_name(self.function)} for backward gave "
                f"different tensors than its forward: {'; '.join(mismatches)}. {_ADVICE}"
            )

    def _clear(self) -> None:
        for reference in self.holders:
            holder = reference()
            if holder is not None:
                holder.value = None


def run_non_reentrant(
    function: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    options: Options,
    *,
    context_fn: ContextFn | None = None,
    determinism_check: str = "default",
) -> Any:
    """Run ``function(*args, **kwargs)`` without keeping its activations for backward.

    Args:
        function: The function to checkpoint.
        args: Its positional arguments.
        kwargs: Its keyword arguments.
        options: Backend, RNG and offload settings.
        context_fn: Returns two context managers: one entered around the forward, one
            around the recomputation.
        determinism_check: ``"default"`` compares the count, shapes, dtypes and
            devices of the saved tensors between forward and recomputation;
            ``"none"`` skips that.

    Returns:
        What ``function`` returns.
    """
    if not torch.is_grad_enabled():
        return function(*args, **kwargs)
    forward_context, recompute_context = (None, None) if context_fn is None else context_fn()
    state = ForwardState.capture(options.backend, options.preserve_rng_state)
    frame = _Frame(
        function,
        args,
        kwargs,
        options,
        state,
        check=determinism_check == "default",
        recompute_context=recompute_context,
    )
    outputs: Any = _MISSING
    try:
        with ExitStack() as stack:
            if forward_context is not None:
                stack.enter_context(forward_context)
            stack.enter_context(torch.autograd.graph.saved_tensors_hooks(frame.pack, frame.unpack))
            outputs = function(*args, **kwargs)
    except BaseException:
        state.restore_rng()
        raise
    finally:
        wait_for_copies(list(frame.host_copies.values()), options.backend)
    if outputs is _MISSING:
        state.restore_rng()
        raise CheckpointError(
            "checkpointing: the forward context returned by context_fn suppressed an "
            "exception raised by the checkpointed function, so there is no output to "
            "return. Make that context manager let exceptions propagate."
        )
    return outputs
