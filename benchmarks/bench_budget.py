"""Checkpointing to a memory budget on every model family: activation memory against step time.

The zoo (``_zoo.py``, benchmark shapes, random weights): a ResNet-style CNN with
BatchNorm, ViT, GPT-2, Llama, T5 and Mixtral (the last five from transformers'
configs); an LSTM language model and a stack of a user's childless layers (module
shapes without children); BERT masked LM, ConvNeXt, Whisper, Phi and Mamba (from
transformers' configs) and a diffusion UNet (diffusers' ``UNet2DModel``); ALBERT (one
layer at six depths, from transformers' config) and, in plain torch, one
``nn.TransformerEncoderLayer`` called at six depths (``shared``), a Qwen2-style GQA
decoder, a masked autoencoder drawing its mask in ``forward``, a wav2vec-like speech
encoder and a Swin transformer. For each model, on the selected backend, these variants
train on the same data:

* ``plain``: no checkpointing;
* ``budget 0.75``, ``budget 0.5``, ``budget 0.25``: ``plan_checkpointing`` then
  ``plan.apply`` (planning time is reported separately);
* ``full``: ours, every repeated block checkpointed (``check_fn`` on the block class);
* ``torch per-block``: ``torch.utils.checkpoint.checkpoint`` on every block;
* ``torch selective``: the same with torch's selective policy "save matmuls (mm, addmm,
  bmm, baddbmm), recompute the rest" (torch 2.5 and later);
* ``torchtitan op rule``: every block through ``torch.utils.checkpoint.checkpoint`` with
  ``create_selective_checkpoint_contexts`` (torch 2.5 and later) and torchtitan's
  operator rule (its ``_save_list`` policy): the outputs of ``aten.mm``, ``addmm``,
  ``bmm``, ``baddbmm``, ``convolution`` and the fused attention operators
  (``aten._scaled_dot_product_*attention*``: flash, flash for CPU, efficient, cuDNN,
  overrideable) are saved, except every second ``aten.mm`` of each block call (the
  2nd, 4th, ... counted from the block's start, forward and recompute counted apart, so
  both see the same calls); every other operator is recomputed. ``addmm`` (a biased
  ``nn.Linear``) is always saved, as torchtitan's list holds only ``mm`` (its models
  have no biases); attention run with dropout on the CPU goes through the math path
  (``bmm``, softmax, dropout), whose ``bmm`` outputs are saved. On an older torch the
  variant is reported unavailable, with the reason;
* ``plain again`` and ``budget 0.5 again``: a second copy of the plain model, and the
  0.5 plan applied to a second copy, timed in the same rounds: the run's noise
  (``_budget_checks.noise``);
* ``plan at torch selective's memory``, ``plan at torchtitan op rule's memory``: the
  planner at each fixed rule's measured memory (a fraction of plain's), timed in the
  same rounds, for the dominance check below;
* with ``--compile``: ``compiled``: ``torch.compile(plain)``; ``compiled, torch budget
  0.5``: the same compiled with ``torch._functorch.config.activation_memory_budget =
  0.5``; ``compiled, plan 0.5``: ``torch.compile`` of the model after our 0.5 plan.

A budget the planner cannot reach for a family (it raises) is reported unavailable
for that family with the planner's message, and the family's other variants still run.

Measures:

* activation bytes (eager variants): the bytes the forward leaves alive
  (``LiveActivationMeter``: autograd's saved storages, checkpoint inputs, selective
  caches), less what the plain model's forward leaves alive besides its saved storages
  (its output), over the plain model's saved storages: what the tests check against
  the budget. Compiled variants: the storages the autograd graph of one forward saves,
  found by walking it (``graph_saved_bytes``: saved-tensor hooks do not see inside a
  compiled graph), over the same walk of the eager plain model;
* the plain step's bytes as the planner's profile counts them beside the measured ones
  (``plain_bytes``: ``profiled``, ``measured``, ``error`` as a fraction of measured;
  the target is 0.02);
* step time: median over the rounds after ``--warmup``; each round runs one step of
  every variant in a rotating order; ratios are medians of per-round ratios to
  ``plain`` (eager). At least ``--steps`` rounds, then more until plain against plain
  and the 0.5 plan against itself agree within 0.03 (``_budget_checks.AGREEMENT``), or
  ``--max-steps`` rounds. The larger of the two differences is the run's ``noise``,
  reported beside every time figure (each row's ``noise``, the family's ``noise`` with
  both pairs and the rounds taken): a time difference under it is not a finding. The
  table's ``measured`` column is this ratio; its ``estimate`` column, for the budget
  variants, is the plan's ``estimated_step_time_ratio`` (what the planner expected
  before running it), and ``|est - meas|`` their difference;
* exactness: loss and every gradient bit-equal to ``plain`` (eager variants, same
  dropout masks). On a backend other than the CPU a variant is also exact where its
  largest difference from ``plain`` (``grad_difference``: over the loss and every
  gradient, each over its tensor's largest magnitude, floored at ``SCALE_FLOOR`` of the
  model's largest gradient) is within ``GPU_TOLERANCE``
  (1e-4). Gradients are taken with torch's deterministic algorithms (CUDA's atomic-add
  kernels otherwise sum in a varying order), and the plain model's own rerun difference
  is reported beside it
  (``plain_rerun_difference``); ``bit_equal`` keeps the strict answer. Compiled
  variants report ``bit_equal``, ``grad_difference`` and the largest absolute gradient
  difference (``grad_difference_to_compiled``) against ``compiled`` (the compiler's own
  numerics and random streams differ from eager's), and the graph breaks dynamo
  counted while their first step compiled (``graph_breaks``);
* with ``--compile``, the compiled plan's verdict (``compiled_plan`` in the JSON,
  ``_compiled_plan.judge``): its memory against the plan's estimate + 2%
  (``within_estimate``), the graph breaks it adds to the compiled plain model's
  (``graph_breaks_added``), exactness against it (``exact``: bit-equal or within 1e-4)
  and all three (``met``), after each family and in a table at the end.

Dominance (``_budget_checks.dominance``): a fixed rule (``torch selective``,
``torchtitan op rule``) dominates a plan when it keeps no more activation memory and
its step is faster by more than 0.03; each family's ``dominance`` lists, per rule, the
plan at its memory and every plan of the run it dominates, and the file's ``dominance``
counts the dominated families (target: 0). A table of them is printed at the end.

Targets (reported, not asserted): at budget 0.5, memory <= 0.5x (+2%), step time <=
1.20x plain on every model and <= 1.15x on the transformer-shaped ones, and never
slower than ``full``. After every family a summary line, and at the end a summary
table with one row per family, give at budget 0.5 the memory ratio, the measured and
estimated time ratios, ``|estimate - measured|``, and whether the time target, the
budget (+2%) and exactness were met (``summary_at_half`` in the JSON).

Usage: python benchmarks/bench_budget.py [--backend NAME] [--model NAME[,NAME...]|all]
       [--size small|bench|gpu] [--warmup N] [--steps N] [--max-steps N] [--threads N]
       [--compile] [--plot FILE.png] [--note TEXT]

``--size`` picks the zoo's shapes: ``bench`` (the default), ``small`` (the tests'), or
``gpu`` (wider and longer, for a CUDA run: ``gpt2``, ``llama``, ``qwen2``, ``vit``,
``resnet``, ``shared`` and ``bert``; another family runs at its bench size, with a line
saying so). A size other than ``bench`` or a subset of the families writes a file of its
own (``budget-gpu-gpt2-llama-cuda-<date>.json``).

A subset of the families: ``--model lstm,custom,bert`` (comma-separated, no spaces).
Families whose package (transformers, diffusers) is missing are skipped with a line.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
import torch.utils.checkpoint
from _budget_checks import (
    AGAIN,
    RULES,
    at_memory,
    count_dominated,
    dominance,
    is_plan,
    noise,
    print_dominance,
)
from _compiled_plan import MARGIN, counted_graph_breaks, judge
from _report import print_table, write_results
from _zoo import FAMILIES, SIZES, TRANSFORMERS, ZooModel, build, gpu_size, unusable
from torch import nn

import accel
from accel import Accelerator
from accel._compat import selective_checkpoint_api
from checkpointing import (
    CheckpointPlan,
    apply_activation_checkpointing,
    plan_checkpointing,
)
from checkpointing._measure import graph_saved_bytes as walk_saved_bytes

BUDGETS = (0.75, 0.5, 0.25)
TARGET_BYTES, TARGET_TIME, TARGET_TRANSFORMER = 0.5, 1.20, 1.15
#: Off the CPU, a variant whose gradients differ from plain's by at most this fraction of
#: each tensor's largest magnitude counts as exact (atomic-add kernels sum in any order).
GPU_TOLERANCE = 1e-4
#: A gradient under this fraction of the model's largest is compared on that scale: on
#: CPU the key projection biases of the zoo's BERT and ViT get 1e-12 to 1e-10 against a
#: largest gradient near 1 (softmax ignores a shift shared by every key).
SCALE_FLOOR = 1e-3
TORCH_VARIANTS = ("torch per-block", "torch selective", "torchtitan op rule")
COMPILED = ("compiled", "compiled, torch budget 0.5", "compiled, plan 0.5")
#: The plan timed twice in each run, for the noise.
REPEATED = "budget 0.5"


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
) -> tuple[nn.Module, dict[str, Any]]:
    """A fresh copy of the model set up as ``name``, and facts about it (plan, timings).

    ``budget`` plans at that fraction (``plan at <rule>'s memory``); ``plan`` applies a
    plan made before to this copy (``budget 0.5 again``); ``plain again`` is a copy.
    Facts whose key starts with ``_`` stay out of the JSON (the plan itself).
    """
    model = copy.deepcopy(case.model)
    facts: dict[str, Any] = {}
    if plan is not None:
        plan.apply(model, backend=backend)
    elif name.startswith(("budget", "plan at ")) or name == "compiled, plan 0.5":
        fraction = float(name.split()[-1]) if budget is None else budget
        started = time.perf_counter()
        plan = plan_checkpointing(model, case.inputs, fraction, backend=backend)
        facts["planning_seconds"] = time.perf_counter() - started
        plan.apply(model, backend=backend)
        facts["_plan"] = plan
        facts["budget"] = fraction
        facts["plan"] = str(plan)
        facts["estimated_time_ratio"] = plan.estimated_step_time_ratio
        facts["estimated_bytes_ratio"] = plan.estimated_bytes / plan.plain_bytes
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


def graph_saved_bytes(case: ZooModel, model: nn.Module) -> int:
    """Bytes of the storages the autograd graph of one forward saves (:func:`checkpointing.
    _measure.graph_saved_bytes`: a compiled graph's too), parameters and buffers excluded.

    Only for variants without checkpoint hooks (reading a hooked saved tensor would
    recompute it).
    """
    output = case.call(model)
    outputs = output if isinstance(output, torch.Tensor) else dict(output)
    return walk_saved_bytes(outputs, [*model.parameters(), *model.buffers()])


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


def _build_variants(
    case: ZooModel,
    variants: list[str],
    backend: Accelerator,
    unavailable: dict[str, str],
    models: dict[str, nn.Module],
    facts: dict[str, dict[str, Any]],
    budgets: dict[str, float] | None = None,
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
            models[name], facts[name] = variant(case, name, backend, budget=budget, plan=plan)
        except ValueError as error:  # a budget the planner cannot reach for this model
            if not name.startswith(("budget", "plan at ")):
                raise
            unavailable[name] = f"plan_checkpointing raised: {error}"
        except Exception as error:  # a compiler that fails on this host: reported, not fatal
            if not name.startswith("compiled"):
                raise
            unavailable[name] = f"failed: {type(error).__name__}: {error}"[:300]


def _time_rounds(
    case: ZooModel,
    models: dict[str, nn.Module],
    variants: list[str],
    backend: Accelerator,
    args: argparse.Namespace,
) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Seconds per round by variant, and the run's noise: at least ``--steps`` rounds,
    more until the pairs timed twice agree (``_budget_checks.noise``), at most
    ``--max-steps``."""
    for _ in range(args.warmup):
        for name in variants:
            step(case, models[name], backend)
    times: dict[str, list[float]] = {name: [] for name in variants}
    repeated = REPEATED if REPEATED + AGAIN in models else None
    while True:
        shift = len(times["plain"]) % len(variants)
        for name in variants[shift:] + variants[:shift]:
            times[name].append(step(case, models[name], backend))
        rounds = len(times["plain"])
        if rounds >= args.steps:
            found = noise(times, repeated)
            if found["agreed"] or rounds >= max(args.max_steps, args.steps):
                return times, found


def run_case(family: str, backend: Accelerator, args: argparse.Namespace) -> dict[str, Any]:
    size, note = gpu_size(family, args.size)
    if note is not None:
        print(note)
    case = build(family, size).to(backend.device())
    on_cpu = backend.name == "cpu"
    budgets = [f"budget {b}" for b in BUDGETS]
    variants = ["plain", "plain" + AGAIN, *budgets, REPEATED + AGAIN, "full", *TORCH_VARIANTS]
    unavailable: dict[str, str] = {}
    rule = torchtitan_rule()
    if isinstance(rule, str):
        unavailable["torch selective"] = unavailable["torchtitan op rule"] = rule
    if args.compile:
        variants.extend(COMPILED)
    models: dict[str, nn.Module] = {}
    facts: dict[str, dict[str, Any]] = {}
    _build_variants(case, variants, backend, unavailable, models, facts)
    counted = {name: case.held(models[name]) for name in RULES if name in models}
    counted["plain"] = case.held(models["plain"])
    # The planner at each rule's measured memory, as a fraction of plain's.
    plain_live, plain_saved = counted["plain"]
    at_rules = {
        at_memory(rule): min(1.0, (counted[rule][0] - plain_live + plain_saved) / plain_saved)
        for rule in RULES
        if rule in counted
    }
    _build_variants(case, list(at_rules), backend, unavailable, models, facts, at_rules)
    variants += list(at_rules)
    for name, reason in unavailable.items():
        print(f"{family}: {name} unavailable: {reason}"[:400])
    variants = [name for name in variants if name in models]
    # Walked first, and compiled models never run under the meters: a compiled model
    # called inside a dispatch mode or saved-tensor hooks falls back to eager for good.
    walked = {
        name: graph_saved_bytes(case, models[name])
        for name in variants
        if name == "plain" or name.startswith("compiled")
    }
    counted.update(
        (name, case.held(models[name]))
        for name in variants
        if name not in counted and not name.startswith("compiled")
    )
    reference = gradients(case, models["plain"])
    # Off the CPU: how far the plain model is from itself (the kernels' own noise).
    rerun = None if on_cpu else difference(gradients(case, models["plain"]), reference)
    compiled_reference = gradients(case, models["compiled"]) if "compiled" in models else None
    times, run_noise = _time_rounds(case, models, variants, backend, args)
    rows: dict[str, dict[str, Any]] = {}
    for name in variants:
        compiled = name.startswith("compiled")
        live = 0 if compiled else counted[name][0]
        activations = (
            plain_saved * walked[name] // walked["plain"]
            if compiled
            else live - plain_live + plain_saved
        )
        loss, grads = gradients(case, models[name])
        # Compiled variants against the compiled plain model, the others against plain.
        against = compiled_reference if compiled else reference
        assert against is not None
        bit_equal = bool(torch.equal(loss, against[0])) and all(
            torch.equal(a, b) for a, b in zip(grads, against[1], strict=True)
        )
        relative = difference((loss, grads), against)
        if compiled:
            exact = None
            pairs = zip(grads, against[1], strict=True)
            to_compiled = max(float((a - b).abs().max()) for a, b in pairs)
        else:
            # The CPU's rule is bit-equality; elsewhere a tolerance (GPU_TOLERANCE).
            exact = bit_equal or (not on_cpu and relative <= GPU_TOLERANCE)
            to_compiled = None
        measured = statistics.median(
            a / b for a, b in zip(times[name], times["plain"], strict=True)
        )
        estimate = facts[name].get("estimated_time_ratio")
        rows[name] = {
            "activation_bytes": activations,
            "bytes_ratio": activations / plain_saved,
            "step_seconds": statistics.median(times[name]),
            "time_ratio": measured,
            "measured": measured,
            "estimate": estimate,
            "estimate_error": None if estimate is None else abs(estimate - measured),
            "noise": run_noise["noise"],
            "exact": exact,
            "bit_equal": bit_equal,
            "grad_difference": relative,
            "grad_difference_to_compiled": to_compiled,
            **{k: v for k, v in facts[name].items() if k != "plan" and not k.startswith("_")},
        }
    half = rows.get("budget 0.5")
    limit = TARGET_TRANSFORMER if family in TRANSFORMERS else TARGET_TIME
    profiled = next((f["profiled_plain_bytes"] for f in facts.values() if "plan" in f), None)
    return {
        "model": family,
        "size": size,
        "size_note": note,
        # The profile's plain-step bytes against the plain step's saved bytes, measured.
        "plain_bytes": {
            "profiled": profiled,
            "measured": plain_saved,
            "error": None if profiled is None else abs(profiled - plain_saved) / plain_saved,
        },
        "exact_rule": "bit-equal" if on_cpu else f"bit-equal or within {GPU_TOLERANCE:g}",
        "plain_rerun_difference": rerun,
        "variants": rows,
        "noise": run_noise,
        "dominance": dominance(rows),
        "unavailable": unavailable,
        "plans": {k: v["plan"] for k, v in facts.items() if "plan" in v},
        "time_target": limit,
        "target_at_half": half is not None
        and bool(
            half["bytes_ratio"] <= TARGET_BYTES + 0.02
            and half["time_ratio"] <= limit
            and half["time_ratio"] <= rows["full"]["time_ratio"]
        ),
        "summary_at_half": summary_at_half(half, limit, rows["full"]["time_ratio"], run_noise),
        # None where a budget has no plan (the planner raised): nothing to judge there.
        "fits": None
        if any(f"budget {b}" in unavailable for b in BUDGETS)
        else all(rows[f"budget {b}"]["bytes_ratio"] <= b + 0.02 for b in BUDGETS),
        "exact": all(row["exact"] for row in rows.values() if row["exact"] is not None),
        "compiled_plan": judge(rows),
    }


def summary_at_half(
    half: dict[str, Any] | None, limit: float, full_ratio: float, run_noise: dict[str, Any]
) -> dict[str, Any] | None:
    """The budget-0.5 row's summary: memory, measured and estimated time, the targets.

    ``None`` where the planner gave no plan at 0.5. ``met`` is the time target (``limit``),
    the budget plus 2% and exactness together; ``not_slower_than_full`` is reported apart;
    ``noise`` is the run's (``_budget_checks.noise``).
    """
    if half is None:
        return None
    time_met = half["measured"] <= limit
    fits = half["bytes_ratio"] <= TARGET_BYTES + 0.02
    exact = bool(half["exact"])
    return {
        "bytes_ratio": half["bytes_ratio"],
        "measured": half["measured"],
        "estimate": half["estimate"],
        "estimate_error": half["estimate_error"],
        "noise": run_noise["noise"],
        "time_target": limit,
        "time_met": time_met,
        "fits": fits,
        "exact": exact,
        "bit_equal": half.get("bit_equal"),
        "grad_difference": half.get("grad_difference"),
        "not_slower_than_full": half["measured"] <= full_ratio,
        "met": time_met and fits and exact,
    }


def _brief(reason: str) -> str:
    """A short form of why a variant is unavailable, for the tables."""
    start = reason.find("the smallest reachable")
    if start >= 0:
        return "no plan: " + reason[start:].split(" (")[0]
    return reason[:60]


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def print_case(result: dict[str, Any]) -> None:
    print(f"\n{result['model']}: activation memory against step time (ratios to plain)")
    rows = []
    for name, row in result["variants"].items():
        exact = "-" if row["exact"] is None else ("yes" if row["exact"] else "NO")
        if row["exact"] and row.get("bit_equal") is False:
            exact = f"within {row['grad_difference']:.1e}"
        if row["grad_difference_to_compiled"] is not None:
            exact = f"diff {row['grad_difference_to_compiled']:.1e}"
        error = row["estimate_error"]
        rows.append(
            (
                name,
                f"{row['activation_bytes'] / 2**20:.1f} MiB",
                f"{row['bytes_ratio']:.2f}x",
                f"{row['step_seconds'] * 1e3:.1f} ms",
                f"{row['measured']:.2f}x",
                _ratio(row["estimate"]),
                "-" if error is None else f"{error:.2f}",
                exact,
            )
        )
    for name, reason in result["unavailable"].items():
        rows.append((name, "unavailable", "-", "-", "-", "-", "-", _brief(reason)))
    headers = ("variant", "activations", "memory", "step", "measured", "estimate")
    print_table((*headers, "|est - meas|", "exact"), rows)
    verdict = "met" if result["target_at_half"] else "NOT met"
    found = result["noise"]
    pair = "-" if found["plan_vs_plan"] is None else f"{found['plan_vs_plan']:.3f}"
    print(
        f"noise over {found['rounds']} rounds: plain against plain "
        f"{found['plain_vs_plain']:.3f}, plan against plan {pair} (agree within "
        f"{found['within']}: {'yes' if found['agreed'] else 'NO'})"
    )
    print(
        f"target at budget 0.5 (<= {TARGET_BYTES}x memory, <= {result['time_target']}x time, "
        f"<= full): {verdict}; every budget fits: "
        f"{'n/a (a budget has no plan)' if result['fits'] is None else result['fits']}; "
        f"exact: {result['exact']}"
    )
    compiled = result.get("compiled_plan")
    if compiled is not None:
        within = "within" if compiled["within_estimate"] else "OVER"
        print(
            f"compiled plan 0.5: {compiled['bytes_ratio']:.3f}x memory against its estimate "
            f"{compiled['estimate']:.3f}x + {MARGIN} ({within}), "
            f"graph breaks added {compiled['graph_breaks_added']}, exact "
            f"{'bit-equal' if compiled['bit_equal'] else compiled['grad_difference']}: "
            f"{'met' if compiled['met'] else 'NOT met'}"
        )


def print_summary(results: list[dict[str, Any]]) -> None:
    """One row per family at budget 0.5: memory, measured, estimate, the targets."""
    print("\nsummary at budget 0.5 (ratios to plain)")
    rows = []
    for result in results:
        summary = result["summary_at_half"]
        if summary is None:
            reason = result["unavailable"].get("budget 0.5", "no plan")
            rows.append((result["model"], *("-",) * 8, _brief(reason)))
            continue
        time_verdict = "met" if summary["time_met"] else "missed"
        rows.append(
            (
                result["model"],
                f"{summary['bytes_ratio']:.2f}x",
                f"{summary['measured']:.2f}x",
                _ratio(summary["estimate"]),
                f"{summary['estimate_error']:.2f}",
                f"{summary['noise']:.2f}",
                f"<= {summary['time_target']:.2f}x: {time_verdict}",
                "yes" if summary["fits"] else "NO",
                "yes" if summary["exact"] else "NO",
                "met" if summary["met"] else "missed",
            )
        )
    headers = ("model", "memory", "measured", "estimate", "|est - meas|", "noise")
    print_table((*headers, "time target", "within budget +2%", "exact", "target"), rows)
    judged = [(r["model"], r["compiled_plan"]) for r in results if r.get("compiled_plan")]
    if judged:
        print("\ncompiled plan 0.5 (inductor) against the compiled plain model")
        print_table(
            ("model", "memory", "estimate + 2%", "breaks added", "exact", "target"),
            [
                (
                    model,
                    f"{c['bytes_ratio']:.3f}x",
                    f"{c['limit']:.3f}x: {'within' if c['within_estimate'] else 'OVER'}",
                    c["graph_breaks_added"],
                    "bit-equal" if c["bit_equal"] else f"{c['grad_difference']:.1e}",
                    "met" if c["met"] else "missed",
                )
                for model, c in judged
            ],
        )


def draw(results: list[dict[str, Any]], path: str, backend: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(3, len(results))
    lines = -(-len(results) // columns)
    figure, axes = plt.subplots(lines, columns, figsize=(6 * columns, 4.6 * lines), squeeze=False)
    for axis in axes.flat[len(results) :]:
        axis.set_visible(False)
    for axis, result in zip(axes.flat, results, strict=False):
        rows = result["variants"]
        ours = sorted(
            (r["bytes_ratio"], r["time_ratio"])
            for v, r in rows.items()
            if (is_plan(v) and v.startswith("budget")) or v in ("plain", "full")
        )
        axis.plot(*zip(*ours, strict=True), color="C0", alpha=0.4)
        for name, row in rows.items():
            colour = "C1" if name.startswith("torch") else "C2" if name.startswith("comp") else "C0"
            marker = "s" if name.startswith("torch") else "^" if name.startswith("comp") else "o"
            axis.scatter(row["bytes_ratio"], row["time_ratio"], color=colour, marker=marker)
            axis.annotate(
                name,
                (row["bytes_ratio"], row["time_ratio"]),
                textcoords="offset points",
                xytext=(5, 4),
                fontsize=7,
            )
        axis.axvline(TARGET_BYTES, color="grey", linestyle=":", linewidth=1)
        axis.axhline(result["time_target"], color="grey", linestyle=":", linewidth=1)
        axis.set(
            title=f"{result['model']} (blue: accel, orange: torch, green: compiled)",
            xlabel="activation memory / plain",
            ylabel="step time / plain",
        )
        axis.grid(alpha=0.3)
    figure.suptitle(f"Checkpointing to a memory budget on {backend} (lower left is better)")
    # Room for the title above the first row (tight_layout alone lets it overlap).
    figure.tight_layout(rect=(0, 0, 1, 1 - 0.5 / figure.get_figheight()))
    figure.savefig(path, dpi=100)
    plt.close(figure)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="example, three families on one thread: python benchmarks/bench_budget.py "
        "--model lstm,custom,bert --threads 1",
    )
    parser.add_argument("--backend", default=None, help="backend name (default: auto)")
    parser.add_argument(
        "--model",
        default="all",
        help=f"all (default), or a comma-separated subset of: {','.join(FAMILIES)}",
    )
    parser.add_argument(
        "--size",
        choices=SIZES,
        default="bench",
        help="the zoo's shapes: bench (default), small (the tests'), gpu (a CUDA run's)",
    )
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds")
    parser.add_argument("--steps", type=int, default=5, help="timed rounds, at least")
    parser.add_argument(
        "--max-steps",
        type=int,
        default=15,
        help="timed rounds at most, taken until plain against plain and the 0.5 plan "
        "against itself agree within 0.03",
    )
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's)")
    parser.add_argument("--compile", action="store_true", help="add the torch.compile rows")
    parser.add_argument("--plot", metavar="FILE.png", default=None, help="draw the plot")
    parser.add_argument("--note", default="", help="a note for the JSON (how the host was)")
    return parser.parse_args(argv)


def main() -> None:
    # cuBLAS is deterministic only with a fixed workspace, set before its first use.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    args = parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    backend = accel.get_backend(args.backend)
    names = list(FAMILIES) if args.model == "all" else args.model.split(",")
    unknown = [name for name in names if name not in FAMILIES]
    if unknown:
        raise SystemExit(f"unknown families {unknown}; choose from {','.join(FAMILIES)}")
    requested = list(names)
    skipped: dict[str, str] = {}
    for name in list(names):
        reason = unusable(name)
        if reason is not None:
            print(f"{name}: skipped, {reason}")
            skipped[name] = reason
            names.remove(name)
    started = time.perf_counter()
    results: list[dict[str, Any]] = []

    def write() -> Path:
        # After every family, so that a long run that is cut short keeps what it measured.
        # A subset of families gets a file of its own, so as not to replace a full run's.
        subset = "" if args.model == "all" else "-" + "-".join(names)
        size = "" if args.size == "bench" else f"-{args.size}"
        return write_results(
            ("budget-compile" if args.compile else "budget") + size + subset,
            backend.name,
            {
                "size": args.size,
                "requested": requested,
                "skipped": skipped,
                "warmup": args.warmup,
                "steps": args.steps,
                "max_steps": args.max_steps,
                "note": args.note,
                "threads": torch.get_num_threads(),
                "seconds": time.perf_counter() - started,
                # The host's load when the file was written: others' jobs share its cores.
                "load_average": os.getloadavg(),
                "torch_version": torch.__version__,
                "dominance": count_dominated(results),
                "models": results,
            },
        )

    for name in names:
        result = run_case(name, backend, args)
        print_case(result)
        if "budget 0.5" in result["plans"]:
            print(f"\nplan at budget 0.5:\n{result['plans']['budget 0.5']}")
        results.append(result)
        path = write()
    print_summary(results)
    print_dominance(results)
    seconds = time.perf_counter() - started
    print(f"\n{seconds:.0f} s; wrote {path}")
    if args.plot:
        draw(results, args.plot, backend.name)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
