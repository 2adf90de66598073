"""Each saved-tensor-grain call of a budget plan, timed alone (``bench_budget_breakdown.py
--per-call``).

A plan's saved-grain rows ran over their estimate on the zoo's transformers even after
the grain's hooks and replays were timed (issue 40). A whole step is too noisy to say
where: one step's time varies by 15% on the host, more than a few calls' machinery. So
each such call of the plan is run alone, forward and backward, on the very arguments it
gets in the step, and timed in interleaved rounds four ways:

* ``plain``: the module as it is;
* ``bare hooks``: the module under the grain's pack and unpack hooks with nothing
  planned, installed by hand (what hooks alone cost);
* ``wrapper, nothing planned``: the grain's wrapper with no saved tensor planned (the
  wrapper's own checks and set-up on top of its hooks);
* ``plan``: the wrapper with the call's plan.

Each variant's extra time is the median over the rounds of its call less the plain call
of the same round, beside the plan's estimate for the call (its ``recompute_seconds``).
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import _zoo
import torch
from _budget_measure import interleaved, step
from torch import nn
from torch.utils._pytree import tree_map

import accel
from checkpointing import plan_checkpointing
from checkpointing._saved_plan import SavedPlan
from checkpointing._saved_run import PlanIndex, SavedRun
from checkpointing._saved_wrapper import SavedTensorWrapper
from checkpointing._steps import tensors_of

SAVED = "recompute saved"


def _arguments(case: _zoo.ZooModel, name: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments module ``name`` gets in one plain step, detached from that step."""
    seen: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    module = case.model.get_submodule(name)
    handle = module.register_forward_pre_hook(
        lambda _m, args, kwargs: seen.append((args, kwargs)) if not seen else None,
        with_kwargs=True,
    )
    try:
        step(case, case.model, accel.get_backend())
    finally:
        handle.remove()

    def detach(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.detach().requires_grad_(value.requires_grad)
        return value

    args, kwargs = seen[0]
    return tree_map(detach, args), tree_map(detach, kwargs)


def _backward(output: Any) -> None:
    """Backward from the call's first output that needs grad (its hidden states)."""
    first = next(t for t in tensors_of(output) if t.requires_grad)
    first.float().sum().backward()


def _variants(
    module: nn.Module, payload: SavedPlan, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Callable[[], None]]:
    """The four ways one call is run (see the module docstring)."""
    backend = accel.get_backend()
    nothing = replace(payload, positions={})
    index = PlanIndex(nothing)
    empty = SavedTensorWrapper(copy.deepcopy(module), nothing, backend=backend)
    planned = SavedTensorWrapper(copy.deepcopy(module), payload, backend=backend)

    def bare() -> None:
        run = SavedRun(index, module, [])
        with torch.autograd.graph.saved_tensors_hooks(run.pack, run.unpack):
            output = module(*args, **kwargs)
        _backward(output)

    return {
        "plain": lambda: _backward(module(*args, **kwargs)),
        "bare hooks": bare,
        "wrapper, nothing planned": lambda: _backward(empty(*args, **kwargs)),
        "plan": lambda: _backward(planned(*args, **kwargs)),
    }


def _interleaved(variants: dict[str, Callable[[], None]], rounds: int) -> dict[str, list[float]]:
    """Each variant's seconds per round (:func:`interleaved`), after one warm-up call."""
    backend = accel.get_backend()
    for run in variants.values():  # warm-up; the wrappers check their first call
        run()

    def timed(label: str) -> float:
        started = time.perf_counter()
        variants[label]()
        backend.synchronize()
        return time.perf_counter() - started

    return interleaved(timed, list(variants), rounds)


def per_call(family: str, budget: float, rounds: int, size: str = "bench") -> dict[str, Any]:
    """Time each saved-grain call of ``family``'s plan at ``budget`` alone (see above)."""
    case = _zoo.build(family, size)
    plan = plan_checkpointing(copy.deepcopy(case.model), case.inputs, budget)
    estimates = {row.module: row.recompute_seconds for row in plan.rows}
    calls = []
    for name, decision in plan.choices.items():
        if decision.grain != SAVED:
            continue
        payload = decision.payload
        args, kwargs = _arguments(case, name)
        times = _interleaved(
            _variants(case.model.get_submodule(name), payload, args, kwargs), rounds
        )
        plain = times.pop("plain")
        calls.append(
            {
                "module": name,
                "saved_tensors": len(payload.positions),
                "replayed_steps": sum(len(steps) for steps in payload.recipes.values()),
                "plain_seconds": statistics.median(plain),
                "estimated_seconds": estimates.get(name, 0.0),
                "extra_seconds": {
                    label: statistics.median(a - b for a, b in zip(values, plain, strict=True))
                    for label, values in times.items()
                },
            }
        )
    return {"family": family, "budget": budget, "rounds": rounds, "calls": calls}
