"""bench_budget's measures of one variant: a timed step, its gradients, saved bytes.

* :func:`step`: one training step's seconds, the device synchronised on both sides;
* :func:`gradients`: the loss and every gradient of one step, with torch's deterministic
  algorithms, and :func:`difference`: the largest gap between two such sets, each tensor
  over its own scale (floored at :data:`SCALE_FLOOR` of the model's largest gradient).
  Off the CPU a variant within :data:`GPU_TOLERANCE` of plain counts as exact;
* :func:`graph_saved_bytes`: the storages the autograd graph of one forward saves (a
  compiled graph's too), for the variants without checkpoint hooks, and apart from them
  the copies of parameters it saves;
* :func:`timed_plans`: plans applied each to its own copy of a model, timed in
  interleaved rounds beside the plain model.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping

import torch
from _zoo import ZooModel
from torch import nn

from accel import Accelerator
from checkpointing import CheckpointPlan
from checkpointing._measure import graph_saved_bytes as walk_saved_bytes

__all__ = [
    "GPU_TOLERANCE",
    "SCALE_FLOOR",
    "difference",
    "gradients",
    "graph_saved_bytes",
    "interleaved",
    "step",
    "timed_plans",
]

#: Off the CPU, a variant whose gradients differ from plain's by at most this fraction of
#: each tensor's largest magnitude counts as exact (atomic-add kernels sum in any order).
GPU_TOLERANCE = 1e-4
#: A gradient under this fraction of the model's largest is compared on that scale: on
#: CPU the key projection biases of the zoo's BERT and ViT get 1e-12 to 1e-10 against a
#: largest gradient near 1 (softmax ignores a shift shared by every key).
SCALE_FLOOR = 1e-3


def graph_saved_bytes(case: ZooModel, model: nn.Module) -> tuple[int, int]:
    """Bytes of the storages the autograd graph of one forward saves (:func:`checkpointing.
    _measure.graph_saved_bytes`: a compiled graph's too), parameters and buffers excluded,
    and apart from them the bytes of the parameters' copies it saves.

    The copies are parameters laid out anew by the compiler (inductor's channels-last
    convolution weights), saved in the plain compiled step as in a planned one: they grow
    with the parameters, not the batch, so they are reported, not counted as activations.
    Only for variants without checkpoint hooks (reading a hooked saved tensor would
    recompute it).
    """
    output = case.call(model)
    outputs = output if isinstance(output, torch.Tensor) else dict(output)
    exclude = [*model.parameters(), *model.buffers()]
    counted = walk_saved_bytes(outputs, exclude, copies_of=exclude)
    return counted, walk_saved_bytes(outputs, exclude) - counted


def gradients(case: ZooModel, model: nn.Module) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The loss and every gradient of one step, with torch's deterministic algorithms.

    Without them CUDA's atomic-add kernels sum in a varying order, and a gradient that is
    zero but for rounding (the key projection's bias: softmax ignores a shift shared by
    every key) differs from one run to the next by more than its own size.
    """
    was = torch.are_deterministic_algorithms_enabled()
    was_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        # Strict first: only then does CUDA's memory-efficient attention take its
        # deterministic backward (warn-only keeps the atomic one, as torch warns). Warn-only
        # where an operator has no deterministic kernel on this device.
        for warn_only in (False, True):
            torch.use_deterministic_algorithms(True, warn_only=warn_only)
            torch.manual_seed(7)
            try:
                loss = case.loss(model)
                torch.autograd.backward(loss)
                break
            except RuntimeError as error:
                if warn_only or "deterministic" not in str(error):
                    raise
                model.zero_grad(set_to_none=True)
    finally:
        torch.use_deterministic_algorithms(was, warn_only=was_warn_only)
    grads = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def difference(
    found: tuple[torch.Tensor, list[torch.Tensor]],
    reference: tuple[torch.Tensor, list[torch.Tensor]],
) -> float:
    """The largest difference over the loss and every gradient, each over its scale.

    A tensor's scale is its largest value, but never under ``SCALE_FLOOR`` times the
    largest value of any gradient: a gradient that is zero but for rounding (the key
    projection's bias) would otherwise make its rounding noise look like a 100% error.
    """
    pairs = [(found[0], reference[0]), *zip(found[1], reference[1], strict=True)]
    overall = max((float(b.abs().max()) for b in reference[1] if b.numel()), default=0.0)
    largest = 0.0
    for a, b in pairs:
        scale = max(float(b.abs().max()), SCALE_FLOOR * overall) if b.numel() else 0.0
        gap = float((a - b).abs().max()) if b.numel() else 0.0
        largest = max(largest, gap / scale if scale > 0 else gap)
    return largest


def step(case: ZooModel, model: nn.Module, backend: Accelerator) -> float:
    backend.synchronize()
    start = time.perf_counter()
    torch.autograd.backward(case.loss(model))
    backend.mark_step()
    backend.synchronize()
    elapsed = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    return elapsed


def interleaved(
    timed: Callable[[str], float], labels: list[str], rounds: int
) -> dict[str, list[float]]:
    """Each label's seconds per round (``timed(label)``), the order rotated each round."""
    times: dict[str, list[float]] = {label: [] for label in labels}
    for index in range(rounds):
        shift = index % len(labels)
        for label in labels[shift:] + labels[:shift]:
            times[label].append(timed(label))
    return times


def timed_plans(
    case: ZooModel,
    plans: Mapping[str, CheckpointPlan | None],
    backend: Accelerator,
    rounds: int,
) -> dict[str, list[float]]:
    """Each plan's step seconds per round, each plan applied to its own copy of the model.

    ``None`` stands for the plain model. Every copy takes one untimed step first (a
    saved-tensor call checks its first call), then the rounds are interleaved.
    """
    models = {}
    for label, plan in plans.items():
        model = copy.deepcopy(case.model)
        if plan is not None:
            plan.apply(model)
        step(case, model, backend)
        models[label] = model
    return interleaved(lambda label: step(case, models[label], backend), list(models), rounds)
