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
  0.5``; ``compiled, plan 0.5`` and ``compiled, plan 0.25``: ``torch.compile`` of the
  model after our 0.5 and 0.25 plans.

A budget the planner cannot reach for a family (it raises) is reported unavailable
for that family with the planner's message, and the family's other variants still run.

Measures:

* activation bytes (eager variants): the bytes the forward leaves alive
  (``LiveActivationMeter``: autograd's saved storages, checkpoint inputs, selective
  caches), less what the plain model's forward leaves alive besides its saved storages
  (its output), over the plain model's saved storages: what the tests check against
  the budget. Compiled variants: the storages the autograd graph of one forward saves,
  found by walking it (``graph_saved_bytes``: saved-tensor hooks do not see inside a
  compiled graph), over the same walk of the eager plain model. Copies of parameters the
  graph saves (inductor's channels-last convolution weights, in the plain compiled step
  too) grow with the parameters, not the batch: they are not counted, and each compiled
  row gives their bytes (``parameter_copies_bytes``);
* the plain step's bytes as the planner's profile counts them beside the measured ones
  (``plain_bytes``: ``profiled``, ``measured``, ``error`` as a fraction of measured;
  the target is 0.02);
* step time: median over the rounds after ``--warmup``; each round runs one step of
  every variant in a rotating order; ratios are medians of per-round ratios to
  ``plain`` (eager). At least ``--steps`` rounds, then more until plain against plain
  and the 0.5 plan against itself agree within 0.03 (``_budget_checks.AGREEMENT``), or
  ``--max-steps`` rounds. The larger of the two differences is the run's ``noise``,
  reported beside every time figure (each row's ``noise``, the family's ``noise`` with
  both pairs and the rounds taken): a time difference under it is not a finding. Each
  row's ``interval`` is a distribution-free 95% interval for its median ratio
  (``_budget_checks.median_interval``); the rounds also go on until every half-width is
  within ``--within`` (0.04 by default). A step's time on a shared host varies by 15 to
  17% from step to step, so that takes about 100 rounds there; the pairs alone can agree
  by chance in five. The
  table's ``measured`` column is this ratio; its ``estimate`` column, for the budget
  variants, is the plan's ``estimated_step_time_ratio`` (what the planner expected
  before running it), and ``|est - meas|`` their difference;
* minor page faults per step (``page_faults_per_step``, the median over the rounds). By
  default glibc's ``malloc`` keeps freed memory for reuse (``--allocator held``,
  ``_allocator.hold_freed_memory``): with its own thresholds, which of a step's blocks
  are faulted in again varies from step to step (0 to 11,000 faults on GPT-2's here).
  The JSON's ``allocator`` says what was set; ``--allocator default`` measures glibc
  as it comes;
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
* with ``--compile``, each compiled plan's verdict (``compiled_plan`` at 0.5 and
  ``compiled_plan_quarter`` at 0.25 in the JSON, ``_compiled_plan.judge``): its memory
  against the plan's estimate + 2% (``within_estimate``), the graph breaks it adds to
  the compiled plain model's (``graph_breaks_added``), exactness against it (``exact``:
  bit-equal or within 1e-4) and all three (``met``), after each family and in a table at the end.

Dominance (``_budget_checks.dominance``): a fixed rule (``torch selective``,
``torchtitan op rule``) dominates a plan when it keeps no more activation memory and
its step is faster by more than 0.03; each family's ``dominance`` lists, per rule, the
plan at its memory and every plan of the run it dominates, and the file's ``dominance``
counts the dominated families (target: 0). A table of them is printed at the end.

Budget order (``_budget_checks.budget_order``): a looser budget's plan measured slower
than a tighter one's by more than 0.03 is a finding, unless both budgets gave the same
plan (``plan_digest``), where the difference is the run's noise; each family's
``budget_order`` lists the pairs, the file's counts the families (target: 0).

Targets (reported, not asserted): at budget 0.5, memory <= 0.5x (+2%), step time <=
1.20x plain on every model and <= 1.15x on the transformer-shaped ones, and never
slower than ``full``. After every family a summary line, and at the end a summary
table with one row per family, give at budget 0.5 the memory ratio, the measured and
estimated time ratios, ``|estimate - measured|``, and whether the time target, the
budget (+2%) and exactness were met (``summary_at_half`` in the JSON).

Mixed plans (issue 39): off the host and off lazy devices, ``budget+offload 0.5`` and
``budget+offload 0.25`` plan with ``offload_activations=True`` (keep, recompute or
offload each module call's activations); ``mixed_against_recompute`` in the JSON gives
each one's step time over the recompute-only plan's at the same budget (target: at most
1.0, and half the recompute-only overhead gone at 0.25 on a GPU).

Out of sample (``--out-of-sample benchmarks/results/rates-cpu-<date>.json``): the
built-in CPU rates are medians over ``bench_rates.py``'s runs, one per zoo family, so a
family's estimate is in sample. With this option each family is planned with those
runs combined without its own (``_rates_runs.left_out``), and its ``rates`` in the JSON
say so (``out_of_sample``, ``source``). A family the file has no run of (Mixtral, the
UNet) is priced with all of them, which are out of sample for it already.

Fused attention (``--fused-attention``): the zoo's transformers train without attention
dropout (``_fused_attention.py``), so that on the host their attention runs as its fused
kernel, not the math path their dropout sends it through; ten families change (ViT,
GPT-2, Llama, T5, Mixtral, Whisper, Phi, the shared layer, ALBERT, the speech
encoder), and ``attention_dropout_off`` in the JSON lists what was switched off. No
rate was tuned on those steps. Its file's name ends in ``-fused-attention``.

``--rows targets`` times only ``plain``, ``plain again`` and the three budgets: what the
estimates, the time targets at 0.5 and the budget order are judged on, at under half
of a round's cost, for runs long enough to narrow the intervals. Its file's name ends in
``-targets``; it has no dominance rows.

Usage: python benchmarks/bench_budget.py [--backend NAME] [--model NAME[,NAME...]|all]
       [--size small|bench|gpu] [--warmup N] [--steps N] [--max-steps N] [--threads N]
       [--within HALF_WIDTH] [--rows all|targets]
       [--compile] [--plot FILE.png] [--note TEXT] [--out-of-sample RATES.json]
       [--fused-attention] [--allocator held|default]

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
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from _allocator import add_option, minor_faults, settle
from _budget_checks import (
    AGAIN,
    RULES,
    TARGET_BYTES,
    TARGET_TIME,
    TARGET_TRANSFORMER,
    WITHIN,
    at_memory,
    budget_order,
    count_dominated,
    count_looser_slower,
    dominance,
    noise,
    print_dominance,
    summary_at_half,
)
from _budget_measure import GPU_TOLERANCE, difference, gradients, graph_saved_bytes, step
from _budget_print import draw, print_case, print_summary
from _budget_variants import COMPILED, OFFLOAD, TORCH_VARIANTS, build_variants, torchtitan_rule
from _compiled_plan import VERDICTS, judge
from _fused_attention import without_attention_dropout
from _rates_runs import left_out
from _report import write_results
from _zoo import FAMILIES, SIZES, TRANSFORMERS, ZooModel, build, gpu_size, unusable
from torch import nn

import accel
from accel import Accelerator

BUDGETS = (0.75, 0.5, 0.25)
#: Budgets at which the mixed plans (keep, recompute or offload) are set against the
#: recompute-only plans of the same run (issue 39).
MIXED_BUDGETS = (0.5, 0.25)
#: The plan timed twice in each run, for the noise.
REPEATED = "budget 0.5"


def _time_rounds(
    case: ZooModel,
    models: dict[str, nn.Module],
    variants: list[str],
    backend: Accelerator,
    args: argparse.Namespace,
) -> tuple[dict[str, list[float]], dict[str, list[int]], dict[str, Any]]:
    """Seconds and minor page faults per round by variant, and the run's noise: at least
    ``--steps`` rounds, more until the pairs timed twice agree (``_budget_checks.noise``),
    at most ``--max-steps``."""
    for _ in range(args.warmup):
        for name in variants:
            step(case, models[name], backend)
    times: dict[str, list[float]] = {name: [] for name in variants}
    faults: dict[str, list[int]] = {name: [] for name in variants}
    repeated = REPEATED if REPEATED + AGAIN in models else None
    while True:
        shift = len(times["plain"]) % len(variants)
        for name in variants[shift:] + variants[:shift]:
            before = minor_faults()
            times[name].append(step(case, models[name], backend))
            faults[name].append(minor_faults() - before)
        rounds = len(times["plain"])
        if rounds >= args.steps:
            found = noise(times, repeated, args.within)
            if found["agreed"] or rounds >= max(args.max_steps, args.steps):
                return times, faults, found


def _fresh_compiler() -> None:
    """Forget earlier families' graphs and allow a recompilation per compiled variant.

    transformers' models share one decorated ``forward`` code object, and the exactness
    check compiles again under deterministic algorithms: four compiled variants of two
    families passed dynamo's limit of 8 recompilations, after which it ran the frame
    eagerly and the compiled rows measured the plain model's memory.
    """
    torch._dynamo.reset()
    config = torch._dynamo.config
    # ``recompile_limit`` is ``cache_size_limit`` before torch 2.6.
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), 4 * len(COMPILED)))


def run_case(family: str, backend: Accelerator, args: argparse.Namespace) -> dict[str, Any]:
    size, note = gpu_size(family, args.size)
    if note is not None:
        print(note)
    case = build(family, size).to(backend.device())
    fused = without_attention_dropout(case.model) if args.fused_attention else []
    on_cpu = backend.name == "cpu"
    budgets = [f"budget {b}" for b in BUDGETS]
    variants = ["plain", "plain" + AGAIN, *budgets]
    unavailable: dict[str, str] = {}
    if args.rows == "all":
        variants += [REPEATED + AGAIN, "full", *TORCH_VARIANTS]
        rule = torchtitan_rule()
        if isinstance(rule, str):
            unavailable["torch selective"] = unavailable["torchtitan op rule"] = rule
        mixed = [f"{OFFLOAD} {b}" for b in MIXED_BUDGETS]
        if backend.device().type == "cpu" or backend.is_lazy:
            reason = "the offload grain is not offered here (the device is the host, or lazy)"
            unavailable.update(dict.fromkeys(mixed, reason))
        else:
            variants.extend(mixed)
    if args.compile:
        variants.extend(COMPILED)
        _fresh_compiler()
    models: dict[str, nn.Module] = {}
    facts: dict[str, dict[str, Any]] = {}
    rates = None if args.out_of_sample is None else left_out(args.out_of_sample, family)
    build_variants(case, variants, backend, unavailable, models, facts, rates=rates)
    counted = {name: case.held(models[name]) for name in RULES if name in models}
    counted["plain"] = case.held(models["plain"])
    # The planner at each rule's measured memory, as a fraction of plain's.
    plain_live, plain_saved = counted["plain"]
    at_rules = {
        at_memory(rule): min(1.0, (counted[rule][0] - plain_live + plain_saved) / plain_saved)
        for rule in RULES
        if rule in counted
    }
    build_variants(case, list(at_rules), backend, unavailable, models, facts, at_rules, rates)
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
    times, faults, run_noise = _time_rounds(case, models, variants, backend, args)
    rows: dict[str, dict[str, Any]] = {}
    for name in variants:
        compiled = name.startswith("compiled")
        live = 0 if compiled else counted[name][0]
        activations = (
            plain_saved * walked[name][0] // walked["plain"][0]
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
            "page_faults_per_step": statistics.median(faults[name]),
            # Compiled: the parameters' copies its graph saves (not in activation_bytes).
            "parameter_copies_bytes": walked[name][1] if compiled else None,
            "time_ratio": measured,
            "measured": measured,
            "estimate": estimate,
            "estimate_error": None if estimate is None else abs(estimate - measured),
            "noise": run_noise["noise"],
            # The 95% interval of the median ratio to plain (_budget_checks.median_interval).
            "interval": run_noise["intervals"].get(name, [1.0, 1.0]),
            "exact": exact,
            "bit_equal": bit_equal,
            "grad_difference": relative,
            "grad_difference_to_compiled": to_compiled,
            **{k: v for k, v in facts[name].items() if k != "plan" and not k.startswith("_")},
        }
    half = rows.get("budget 0.5")
    full = rows["full"]["time_ratio"] if "full" in rows else None
    limit = TARGET_TRANSFORMER if family in TRANSFORMERS else TARGET_TIME
    profiled = next((f["profiled_plain_bytes"] for f in facts.values() if "plan" in f), None)
    return {
        "model": family,
        "size": size,
        "size_note": note,
        # With --fused-attention: the attention dropout switched off, attribute by attribute.
        "attention_dropout_off": fused,
        # The profile's plain-step bytes against the plain step's saved bytes, measured.
        "plain_bytes": {
            "profiled": profiled,
            "measured": plain_saved,
            "error": None if profiled is None else abs(profiled - plain_saved) / plain_saved,
        },
        # Out of sample: priced with rates calibrated without this family's run.
        "rates": {
            "source": "default" if rates is None else rates.source,
            "out_of_sample": rates is not None,
        },
        "exact_rule": "bit-equal" if on_cpu else f"bit-equal or within {GPU_TOLERANCE:g}",
        "plain_rerun_difference": rerun,
        "variants": rows,
        "noise": run_noise,
        "dominance": dominance(rows),
        "budget_order": budget_order(rows),
        # Each mixed plan's step against the recompute-only plan's at the same budget.
        "mixed_against_recompute": {
            str(b): rows[f"{OFFLOAD} {b}"]["time_ratio"] / rows[f"budget {b}"]["time_ratio"]
            for b in MIXED_BUDGETS
            if f"{OFFLOAD} {b}" in rows and f"budget {b}" in rows
        },
        "unavailable": unavailable,
        "plans": {k: v["plan"] for k, v in facts.items() if "plan" in v},
        "time_target": limit,
        "target_at_half": half is not None
        and bool(
            half["bytes_ratio"] <= TARGET_BYTES + 0.02
            and half["time_ratio"] <= limit
            and (full is None or half["time_ratio"] <= full)
        ),
        "summary_at_half": summary_at_half(half, limit, full, run_noise),
        # None where a budget has no plan (the planner raised): nothing to judge there.
        "fits": None
        if any(f"budget {b}" in unavailable for b in BUDGETS)
        else all(rows[f"budget {b}"]["bytes_ratio"] <= b + 0.02 for b in BUDGETS),
        "exact": all(row["exact"] for row in rows.values() if row["exact"] is not None),
        **{key: judge(rows, plan) for key, plan, _ in VERDICTS},
    }


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
        "against itself agree within 0.03 and every row's interval is --within",
    )
    parser.add_argument(
        "--within",
        type=float,
        default=WITHIN,
        help=f"the half-width of each row's 95%% interval needed to stop (default {WITHIN})",
    )
    parser.add_argument(
        "--rows",
        choices=("all", "targets"),
        default="all",
        help="all (default); targets: only plain, plain again and the three budgets, for "
        "runs long enough to judge the estimates, the time targets and the budget order",
    )
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's)")
    parser.add_argument("--compile", action="store_true", help="add the torch.compile rows")
    add_option(parser)
    parser.add_argument("--plot", metavar="FILE.png", default=None, help="draw the plot")
    parser.add_argument("--note", default="", help="a note for the JSON (how the host was)")
    parser.add_argument(
        "--out-of-sample",
        metavar="RATES.json",
        default=None,
        help="plan each family with the rates of this bench_rates.py results file "
        "combined without that family's run (its estimates then out of sample)",
    )
    parser.add_argument(
        "--fused-attention",
        action="store_true",
        help="train the transformers without attention dropout, so that their attention "
        "runs as the device's fused kernel (an out-of-sample check of its rates)",
    )
    return parser.parse_args(argv)


def results_name(args: argparse.Namespace, names: list[str]) -> str:
    """The results file's name before its backend and date: what the run timed."""
    # A subset of families gets a file of its own, so as not to replace a full run's.
    subset = "" if args.model == "all" else "-" + "-".join(names)
    subset += "-targets" if args.rows == "targets" else ""
    subset += "-fused-attention" if args.fused_attention else ""
    # Out-of-sample rates make other plans: never the same file as an in-sample run's.
    subset += "-out-of-sample" if args.out_of_sample is not None else ""
    size = "" if args.size == "bench" else f"-{args.size}"
    return ("budget-compile" if args.compile else "budget") + size + subset


def main() -> None:
    # cuBLAS is deterministic only with a fixed workspace, set before its first use.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    args = parse_args()
    allocator = settle(args.allocator)
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
        return write_results(
            results_name(args, names),
            backend.name,
            {
                "size": args.size,
                "requested": requested,
                "skipped": skipped,
                "warmup": args.warmup,
                "steps": args.steps,
                "max_steps": args.max_steps,
                "within": args.within,
                "rows": args.rows,
                "note": args.note,
                "threads": torch.get_num_threads(),
                "allocator": allocator,
                "seconds": time.perf_counter() - started,
                # The host's load when the file was written: others' jobs share its cores.
                "load_average": os.getloadavg(),
                "torch_version": torch.__version__,
                "dominance": count_dominated(results),
                "budget_order": count_looser_slower(results),
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
    order = count_looser_slower(results)
    names = f" ({', '.join(order['names'])})" if order["names"] else ""
    same = ", ".join(order["same_plan_only"]) or "none"
    print(
        f"looser budget slower than a tighter one by more than 0.03: {order['looser_slower']} "
        f"of {order['families']} families{names}; target 0 (the same plan at both, so the "
        f"run's noise: {same})"
    )
    seconds = time.perf_counter() - started
    print(f"\n{seconds:.0f} s; wrote {path}")
    if args.plot:
        draw(results, args.plot, backend.name)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
