"""Plan 51 families the zoo does not hold, as a new user would, and check them.

Each family is a tiny random configuration of a library's model: 29 transformers text
models (``_families_text.py``), 16 transformers image classifiers and 6 diffusers
models (``_families_vision.py``), dropout and stochastic depth on where the family has
them, each trained through the loss its users take (``_family_builders.py``). For each
budget (0.5, 0.25): ``plan_checkpointing`` on a copy, ``plan.apply``, one training step
compared with the plain model's (the loss and every gradient bit-equal, the same seed),
``plan.measure`` (activations measured against the estimate and the budget), a second
step (bit-equal again), then a step of a second instance never planned (planning must
leave nothing behind that breaks it). A family that raises is reported with the error;
one whose library is not installed is reported as skipped; the planner's warnings are
reported, the model's own are not.

Reformer reseeds torch's generator with ``torch.seed()`` in every forward where no CUDA
generator exists (``_init_attention_seed``), so its plain step differs from itself; for
that family alone ``torch.seed`` returns a fixed number while it is checked.

With ``--compile``, each plan is also compiled (``aot_eager``) and judged against the
compiled plain model: graph breaks added, saved bytes against the plan's compiled
estimate + 2% (copies of parameters not counted), bit-equality, and whether the plan's
note said the compiled step would break (a module keeping a state in forward).

Usage: python benchmarks/try_families.py [--family all|text|vision|opt,beit,...] [--compile]
Writes ``benchmarks/results/try-families-cpu-DATE.json`` (``try-families-compiled-...``;
``try-families-vision-...`` for one group, ``try-families-chosen-...`` for named families).
"""

from __future__ import annotations

import argparse
import copy
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from _compiled_plan import MARGIN, counted_graph_breaks
from _families_text import TEXT
from _families_vision import VISION
from _family_builders import Builder, Tried
from _report import print_table, write_results
from torch import nn

BUDGETS = (0.5, 0.25)
FAMILIES: dict[str, Builder] = {**TEXT, **VISION}
#: What ``--family`` takes besides names; each group's results file is named after it.
GROUPS: dict[str, list[str]] = {"all": list(FAMILIES), "text": list(TEXT), "vision": list(VISION)}

#: Families whose forward reseeds torch's generator from the OS (``torch.seed()``).
RESEEDING = ("reformer",)


@contextmanager
def _fixed_torch_seed() -> Iterator[None]:
    """``torch.seed()`` returns a fixed number (Reformer's reseeding, made repeatable)."""
    original = torch.seed
    torch.seed = lambda: 12345  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.seed = original  # type: ignore[assignment]


def _gradients(model: nn.Module, loss: torch.Tensor) -> list[torch.Tensor]:
    """``loss`` and every gradient after its backward; the gradients then cleared."""
    loss.backward()
    grads = [loss.detach()]
    grads += [torch.zeros_like(p) if p.grad is None else p.grad for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


def _step(model: nn.Module, tried: Tried) -> list[torch.Tensor]:
    """The loss and every gradient of one training step, from seed 7."""
    torch.manual_seed(7)
    return _gradients(model, tried.loss(model))


def _equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _compiled(model: nn.Module, tried: Tried) -> tuple[int, int, list[Any]]:
    """Graph breaks, saved bytes and the step's loss and gradients, compiled (aot_eager)."""
    from checkpointing._measure import graph_saved_bytes

    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager")
    torch.manual_seed(7)
    loss, breaks = counted_graph_breaks(lambda: tried.loss(compiled))
    exclude = [*model.parameters(), *model.buffers()]
    saved = graph_saved_bytes(loss, exclude, copies_of=exclude)
    return breaks, saved, _gradients(model, loss)


def _judge_compiled(
    model: nn.Module, planned: nn.Module, plan: Any, tried: Tried
) -> dict[str, Any]:
    """The compiled plan against the compiled plain model: breaks, memory, exactness."""
    breaks, _, expected = _compiled(model, tried)
    planned_breaks, saved, got = _compiled(planned, tried)
    limit = (plan.compiled_estimated_bytes + MARGIN * plan.plain_bytes) / plan.plain_bytes
    return {
        "graph_breaks_added": planned_breaks - breaks,
        "saved_ratio": saved / plan.plain_bytes,
        "limit": limit,
        "within": saved / plan.plain_bytes <= limit,
        "exact": _equal(got, expected),
        # Where the note names calls that keep a state in forward, dynamo's breaks there
        # are what the plan said would happen.
        "said_so": "rebind attributes" in plan.note,
    }


def try_family(name: str, budget: float, compiled: bool = False) -> dict[str, Any]:
    """Plan, apply, train and measure one family at one budget; the findings.

    With ``compiled``, the planned model is also compiled (``aot_eager``) and judged
    against the compiled plain model.
    """
    from checkpointing import plan_checkpointing

    fixed = _fixed_torch_seed() if name in RESEEDING else nullcontext()
    started = time.perf_counter()
    try:
        torch.manual_seed(0)
        tried = FAMILIES[name]()
    except ImportError as error:  # the family's library is not installed here
        return {"family": name, "budget": budget, "error": None, "skipped": str(error)}
    try:
        with fixed, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = tried.model.train()
            # Copied before any step: a model may keep its step's tensors (RecurrentGemma
            # its recurrent state), which deepcopy refuses.
            planned = copy.deepcopy(model)
            reference = _step(model, tried)
            plan = plan_checkpointing(planned, tried.inputs, budget)
            plan.apply(planned)
            exact = _equal(_step(planned, tried), reference)
            report = plan.measure(planned, tried.inputs)
            again = _equal(_step(planned, tried), reference)
            torch.manual_seed(0)
            _step(FAMILIES[name]().model.train(), tried)  # a second instance, never planned
            judged = _judge_compiled(model, planned, plan, tried) if compiled else None
    except Exception as error:  # the finding is the error, reported per family
        return {"family": name, "budget": budget, "error": f"{type(error).__name__}: {error}"}
    return {
        "family": name,
        "budget": budget,
        "error": None,
        "skipped": None,
        "package": tried.package,
        "exact": exact,
        "exact_again": again,
        "measured_ratio": report.activation_bytes / report.plain_bytes,
        "estimated_ratio": plan.estimated_bytes / plan.plain_bytes,
        "over_budget": report.over_budget,
        "decisions": sorted(set(plan.decisions.values())),
        # Where the fake step could not run the model: the plan's note says why.
        "profiled_on_real_tensors": plan.note.startswith("Profiled on real tensors"),
        "note": plan.note,
        "seeded_by_torch_seed_fixed": name in RESEEDING,
        # The planner's own (a decoder's KV cache switched off), once each.
        "warnings": sorted({str(w.message) for w in caught if "checkpointing" in str(w.message)}),
        "compiled": judged,
        "seconds": time.perf_counter() - started,
    }


def _compiled_cell(judged: dict[str, Any]) -> str:
    return (
        f"{judged['graph_breaks_added']}, {judged['saved_ratio']:.3f}x, {judged['limit']:.3f}x, "
        f"{judged['exact']}, {judged['said_so']}"
    )


def _cell(r: dict[str, Any]) -> str:
    if r["error"]:
        return str(r["error"])[:60]
    if r.get("skipped"):
        return f"skipped: {r['skipped']}"[:60]
    return (
        f"{r['exact'] and r['exact_again']}, {r['measured_ratio']:.3f}x "
        f"(est. {r['estimated_ratio']:.3f}x), over budget: {r['over_budget']}"
    )


def _names(chosen: str) -> list[str]:
    names = GROUPS.get(chosen) or chosen.split(",")
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        raise SystemExit(
            f"try_families: no family named {', '.join(unknown)}; name all, text, vision "
            f"or some of: {', '.join(FAMILIES)}."
        )
    return names


def _versions() -> dict[str, str | None]:
    import importlib.metadata as metadata

    found: dict[str, str | None] = {"torch_version": torch.__version__}
    for package in ("transformers", "diffusers"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--family", default="all", help="all, text, vision, or comma-separated names"
    )
    parser.add_argument("--compile", action="store_true", help="also judge them compiled")
    args = parser.parse_args()
    torch.set_num_threads(1)
    names = _names(args.family)
    torch._dynamo.config.recompile_limit = 64  # every family's forward compiled afresh
    found = [try_family(name, budget, args.compile) for name in names for budget in BUDGETS]
    rows = [(r["family"], r["budget"], _cell(r)) for r in found]
    print_table(("family", "budget", "exact, measured (estimate)"), rows)
    tried = [r for r in found if not r.get("skipped")]
    if args.compile:
        print_table(
            ("family", "budget", "compiled: breaks added, saved, limit, exact, note said so"),
            [
                (r["family"], r["budget"], _compiled_cell(r["compiled"]))
                for r in tried
                if not r["error"]
            ],
        )
    real = sorted({r["family"] for r in tried if r.get("profiled_on_real_tensors")})
    print(
        f"profiled on real tensors (the fake step could not run them): {', '.join(real) or 'none'}"
    )
    failed = [r for r in tried if r["error"] or not (r["exact"] and r["exact_again"])]
    print(f"{len(tried) - len(failed)} of {len(tried)} plans exact, without an error", end="")
    print(f"; {len(found) - len(tried)} skipped (a library not installed)")
    chosen = args.family if args.family in GROUPS else "chosen"
    name = "try-families" + ("" if chosen == "all" else f"-{chosen}")
    path = write_results(
        name + ("-compiled" if args.compile else ""),
        "cpu",
        {**_versions(), "threads": 1, "plans": found, "failed": len(failed)},
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
