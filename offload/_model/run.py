"""Running the slices of an :class:`offload.OffloadModel`: configuration, pass, autograd.

:func:`run_slice` runs one slice of a forward. With autograd recording, the slice runs
inside :class:`SliceFunction`, whose backward is the slice's whole backward
(:meth:`offload._model.slice_run.SliceRun.backward`). Imports flow one way: ``config`` (what a pass
needs) <- ``slice_run`` (one slice's run) <- ``run`` <- ``swapped``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .boundary import flatten, unflatten
from .config import Config, Pass
from .slice_run import SliceRun

__all__ = [
    "INVALID_USE_MESSAGE",
    "SliceFunction",
    "parameter_bytes",
    "run_slice",
]

INVALID_USE_MESSAGE = (
    "offload: OffloadModel runs each slice's backward with a nested backward call, so it "
    "works with loss.backward() (or Engine.backward) but not with torch.autograd.grad() "
    "or backward(inputs=...). Call loss.backward() and read the parameters' .grad."
)


class SliceFunction(torch.autograd.Function):
    """Runs one :class:`SliceRun`; its inputs are the run, a dummy and the slice's tensors.

    The dummy requires grad when the slice has trainable parameters, so that backward
    reaches the slice even when none of its input tensors requires grad.
    """

    @staticmethod
    def forward(ctx: Any, run: SliceRun, dummy: torch.Tensor, *tensors: torch.Tensor) -> Any:
        del dummy
        outputs = run.forward(tensors, graph=True)
        ctx.run = run
        ctx.set_materialize_grads(False)
        frozen = [t for t in outputs if not (t.is_floating_point() or t.is_complex())]
        if frozen:
            ctx.mark_non_differentiable(*frozen)
        return tuple(outputs)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:
        if not torch.autograd._is_checkpoint_valid():
            raise RuntimeError(INVALID_USE_MESSAGE)
        run: SliceRun = ctx.run
        return (None, None, *run.backward(grads))


def run_slice(
    config: Config, pass_: Pass, index: int, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], SliceRun]:
    """Run slice ``index`` on ``args`` and ``kwargs``; return its output values and run."""
    storage = config.slices[index]
    tensors, spec = flatten(args, kwargs, where=f"an input of {storage.name}")
    run = SliceRun(config, pass_, index, spec)
    graph = torch.is_grad_enabled() and (storage.trainable or any(t.requires_grad for t in tensors))
    if graph:
        if pass_.first_graph is None:
            pass_.first_graph = index
        dummy = config.trainable_dummy if storage.trainable else config.frozen_dummy
        outputs = list(SliceFunction.apply(run, dummy, *tensors))
    else:
        with torch.no_grad():
            outputs = run.forward(tensors, graph=False)
    assert run.out_spec is not None
    values, _ = unflatten(run.out_spec, outputs)
    return values, run


def parameter_bytes(layer: nn.Module) -> int:
    """Bytes of a layer's parameters (what a slice moves, besides small buffers)."""
    return sum(p.numel() * p.element_size() for p in layer.parameters())
