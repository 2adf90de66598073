"""bench_budget's variants: each model copy set up as one row of the run.

* ``plain`` and ``plain again``: copies of the model as it is;
* ``budget <fraction>``, ``plan at <rule>'s memory`` (the planner at a fraction given
  apart) and ``budget 0.5 again`` (the 0.5 plan applied to a second copy): our planner,
  ``plan_checkpointing`` then ``plan.apply``, the planning time kept;
* ``full``: ours, every repeated block checkpointed;
* the fixed rules through ``torch.utils.checkpoint`` (:data:`TORCH_VARIANTS`): every block
  (:class:`TorchCheckpoint`), torch's "save matmuls" policy (:func:`save_matmuls`) and
  torchtitan's operator rule (:func:`torchtitan_rule`), both with torch's selective
  checkpoint API (torch 2.5 and later);
* the compiled rows (:data:`COMPILED`): ``torch.compile`` of plain, of plain with torch's
  ``activation_memory_budget`` (:func:`inductor_with_budget`), and of the 0.5 and 0.25
  plans.

:func:`build_variants` sets up a list of them and records, for each that cannot be set
up, why (a budget the planner cannot reach, a compiler that fails on this host).
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.utils.checkpoint
from _budget_checks import AGAIN
from _budget_measure import step
from _compiled_plan import counted_graph_breaks
from _zoo import ZooModel
from torch import nn

from accel import Accelerator
from accel._compat import selective_checkpoint_api
from checkpointing import (
    CheckpointPlan,
    DeviceRates,
    apply_activation_checkpointing,
    plan_checkpointing,
)

__all__ = [
    "COMPILED",
    "OFFLOAD",
    "TORCH_VARIANTS",
    "TorchCheckpoint",
    "build_variants",
    "inductor_with_budget",
    "save_matmuls",
    "torchtitan_rule",
    "variant",
]

#: The mixed plans (keep, recompute or offload), as ``"budget+offload 0.5"``.
OFFLOAD = "budget+offload"
TORCH_VARIANTS = ("torch per-block", "torch selective", "torchtitan op rule")
COMPILED = (
    "compiled",
    "compiled, torch budget 0.5",
    "compiled, plan 0.5",
    "compiled, plan 0.25",
)


class TorchCheckpoint(nn.Module):
    """Runs a block through ``torch.utils.checkpoint.checkpoint`` (non-reentrant)."""

    def __init__(self, block: nn.Module, context_fn: Callable[[], Any] | None) -> None:
        super().__init__()
        self.block = block
        self.context_fn = context_fn

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        extra: dict[str, Any] = {} if self.context_fn is None else {"context_fn": self.context_fn}
        return torch.utils.checkpoint.checkpoint(
            self.block, *args, use_reentrant=False, **extra, **kwargs
        )


def save_matmuls() -> Callable[[], Any] | None:
    api = selective_checkpoint_api()
    if isinstance(api, str):
        return None
    create, policy = api
    aten = torch.ops.aten
    matmuls = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}

    def choose(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        return policy.MUST_SAVE if func in matmuls else policy.PREFER_RECOMPUTE

    return lambda: create(choose)


def _aten_overloads(*names: str) -> set[Any]:
    """The ``default`` overloads of the aten operators among ``names`` this torch has."""
    found = set()
    for name in names:
        packet = getattr(torch.ops.aten, name, None)
        overload = None if packet is None else getattr(packet, "default", None)
        if overload is not None:
            found.add(overload)
    return found


def torchtitan_rule() -> Callable[[], Any] | str:
    """A ``context_fn`` with torchtitan's operator rule, or why this torch has none.

    Saves the outputs of ``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``convolution`` and
    the fused attention operators; recomputes every second ``mm`` of a block call (the
    2nd, 4th, ...) and every other operator. A fresh count per call of ``context_fn``,
    i.e. per block call. Where torch calls the policy again while recomputing
    (``ctx.is_recompute``), that pass keeps its own count, as torchtitan's does; torch
    2.13 calls it only in the forward and replays its decisions by index.
    """
    api = selective_checkpoint_api()
    if isinstance(api, str):
        return api
    create, policy = api
    mm = torch.ops.aten.mm.default
    saved = {mm} | _aten_overloads(
        "addmm",
        "bmm",
        "baddbmm",
        "convolution",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_fused_attention_overrideable",
    )

    def context() -> Any:
        counts = {"forward": 0, "recompute": 0}

        def choose(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
            if func == mm:
                mode = "recompute" if getattr(ctx, "is_recompute", False) else "forward"
                counts[mode] += 1
                if counts[mode] % 2 == 0:
                    return policy.PREFER_RECOMPUTE
            return policy.MUST_SAVE if func in saved else policy.PREFER_RECOMPUTE

        return create(choose)

    return context


def _wrap_blocks(model: nn.Module, case: ZooModel, context_fn: Callable[[], Any] | None) -> None:
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if case.is_block(child):
                setattr(parent, name, TorchCheckpoint(child, context_fn))


def variant(
    case: ZooModel,
    name: str,
    backend: Accelerator,
    *,
    budget: float | None = None,
    plan: CheckpointPlan | None = None,
    rates: DeviceRates | None = None,
) -> tuple[nn.Module, dict[str, Any]]:
    """A fresh copy of the model set up as ``name``, and facts about it (plan, timings).

    ``budget`` plans at that fraction (``plan at <rule>'s memory``); ``plan`` applies a
    plan made before to this copy (``budget 0.5 again``); ``plain again`` is a copy;
    ``rates`` replaces the planner's default rates (``--out-of-sample``).
    Facts whose key starts with ``_`` stay out of the JSON (the plan itself).
    """
    model = copy.deepcopy(case.model)
    facts: dict[str, Any] = {}
    if plan is not None:
        plan.apply(model, backend=backend)
    elif name.startswith(("budget", "plan at ", OFFLOAD, "compiled, plan ")):
        fraction = float(name.split()[-1]) if budget is None else budget
        started = time.perf_counter()
        plan = plan_checkpointing(
            model,
            case.inputs,
            fraction,
            backend=backend,
            rates=rates,
            offload_activations=name.startswith(OFFLOAD),
        )
        facts["planning_seconds"] = time.perf_counter() - started
        plan.apply(model, backend=backend)
        facts["_plan"] = plan
        facts["budget"] = fraction
        facts["plan"] = str(plan)
        # One digest per plan, so that two budgets that gave the same plan are known.
        decisions = json.dumps(plan.to_dict()["decisions"], sort_keys=True)
        facts["plan_digest"] = hashlib.sha256(decisions.encode()).hexdigest()[:16]
        facts["estimated_time_ratio"] = plan.estimated_step_time_ratio
        facts["estimated_bytes_ratio"] = plan.estimated_bytes / plan.plain_bytes
        compiled = plan.compiled_estimated_bytes
        facts["estimated_compiled_bytes_ratio"] = (
            None if compiled is None else compiled / plan.plain_bytes
        )
        facts["profiled_plain_bytes"] = plan.plain_bytes
        facts["decisions"] = sorted(set(plan.decisions.values()))
        facts["considered"] = [
            {
                "label": c.label,
                "estimated_bytes_ratio": c.estimated_bytes / plan.plain_bytes,
                "estimated_seconds": c.estimated_seconds,
                "weighed_seconds": c.weighed_seconds,
                "fits": c.fits,
                "taken": c.taken,
            }
            for c in plan.considered
        ]
    elif name == "full":
        apply_activation_checkpointing(model, check_fn=case.is_block, backend=backend)
    elif name in TORCH_VARIANTS:
        context_fn: Callable[[], Any] | None = None
        if name == "torch selective":
            context_fn = save_matmuls()
        elif name == "torchtitan op rule":
            rule = torchtitan_rule()
            assert not isinstance(rule, str), rule
            context_fn = rule
        _wrap_blocks(model, case, context_fn)
    if name.startswith("compiled"):
        budgeted = name == "compiled, torch budget 0.5"
        compiled = cast(
            nn.Module,
            torch.compile(model, backend=inductor_with_budget if budgeted else "inductor"),
        )
        started = time.perf_counter()
        _, facts["graph_breaks"] = counted_graph_breaks(lambda: step(case, compiled, backend))
        facts["compile_seconds"] = time.perf_counter() - started
        return compiled, facts
    return model, facts


def inductor_with_budget(graph: Any, example_inputs: Any) -> Any:
    """Inductor with ``activation_memory_budget = 0.5`` while it partitions the graph.

    A backend of its own, so that dynamo does not reuse another instance's graph
    compiled without the knob (graphs are shared between instances of a class).
    """
    from torch._inductor.compile_fx import compile_fx

    with torch._functorch.config.patch(activation_memory_budget=0.5):
        return compile_fx(graph, example_inputs)


def build_variants(
    case: ZooModel,
    variants: list[str],
    backend: Accelerator,
    unavailable: dict[str, str],
    models: dict[str, nn.Module],
    facts: dict[str, dict[str, Any]],
    budgets: dict[str, float] | None = None,
    rates: DeviceRates | None = None,
) -> None:
    """Set up each of ``variants`` into ``models`` and ``facts``, or say in ``unavailable``
    why not (a budget the planner cannot reach, a compiler that fails on this host)."""
    for name in variants:
        if name in unavailable:
            continue
        repeated = name.removesuffix(AGAIN) if name.endswith(AGAIN) else None
        plan = facts[repeated].get("_plan") if repeated in facts else None
        if repeated is not None and repeated != "plain" and plan is None:
            unavailable[name] = f"{repeated} has no plan"
            continue
        try:
            budget = None if budgets is None else budgets[name]
            models[name], facts[name] = variant(
                case, name, backend, budget=budget, plan=plan, rates=rates
            )
        except ValueError as error:  # a budget the planner cannot reach for this model
            if not name.startswith(("budget", "plan at ", OFFLOAD)):
                raise
            unavailable[name] = f"plan_checkpointing raised: {error}"
        except Exception as error:  # a compiler that fails on this host: reported, not fatal
            if not name.startswith("compiled"):
                raise
            unavailable[name] = f"failed: {type(error).__name__}: {error}"[:300]
