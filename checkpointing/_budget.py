"""``plan_checkpointing``: the fastest checkpointing that fits a memory budget.

From one profiled step (:mod:`._profile`), every module that runs once per step and
has submodules is a candidate at four grains (:mod:`._options`): its saved tensors
(drop those a few cheap operators recompute from tensors that stay saved, pack host
dropout masks into booleans: :mod:`._saved_grain`; nothing runs twice); the whole
module (keep only its inputs); its cheap operators by class (keep its inputs and its
matmul and attention outputs, recompute pointwise activations, dropout and
normalisation); and its operator calls by measured cost (keep the calls that save the
most recompute time per byte, :mod:`._kept_ops`; this is what keeps a host's dropout
masks, whose random draws cost more than the matmuls around them). Each choice saves some activation
bytes and costs some recompute time; :class:`Knapsack` picks the set that saves
enough for the budget in the least time.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from torch import nn

import accel
from accel import Accelerator

from ._args import resolve_backend, validate_budget, validate_planned
from ._caches import refuse_cache_inputs, switch_off_kv_cache
from ._candidates import (
    EVERY_BLOCK,
    Candidate,
    candidate,
    estimate,
    fastest_fitting,
    uniform_candidates,
)
from ._decisions import KEEP, MEASURED, SAVED
from ._knapsack import Knapsack
from ._options import Option, candidates, nothing_to_checkpoint, priced, storage_bytes
from ._overhead import live_bytes, measured_steps, pack_seconds, selective_overhead
from ._plan import CheckpointPlan, ConsideredPlan, PlanRow
from ._profile import StepProfile, profile_step
from ._saved_grain import saved_plan
from ._selective import unavailable_reason
from ._timed import Rounds, plain_step_time, reference, separated, shortfall, steady
from ._timings import REPEATS

__all__ = ["plan_checkpointing"]


def _order(profile: StepProfile, chosen: dict[str, Option]) -> dict[str, Option]:
    order = list(profile.modules)
    return {name: chosen[name] for name in sorted(chosen, key=order.index)}


def _frontier(profile: StepProfile, knapsack: Knapsack, name: str) -> list[str]:
    """The candidates below ``name`` reached through non-candidates only."""
    found = []
    for child in profile.modules[name].children:
        if child in knapsack.options:
            found.append(child)
        else:
            found.extend(_frontier(profile, knapsack, child))
    return found


def _rows(
    profile: StepProfile, knapsack: Knapsack, chosen: dict[str, Option], name: str = ""
) -> list[PlanRow]:
    """One row per chosen module, and per kept module at the level of repeated blocks."""
    if name in chosen:
        option = chosen[name]
        kept = storage_bytes(profile, option.kept) + option.extra_bytes
        return [PlanRow(name, option.kind, option.decision, kept, option.seconds)]
    below = _frontier(profile, knapsack, name)
    inside = any(not name or other.startswith(f"{name}.") for other in chosen)
    repeated = len(below) > 1 and len({profile.modules[b].kind for b in below}) == 1
    if name in knapsack.options and not inside and not repeated:
        owned = [
            index
            for index, stacks in profile.saved_by.items()
            if all(name in stack for stack in stacks)
        ]
        return [PlanRow(name, "module", KEEP, storage_bytes(profile, owned), 0.0)]
    return [row for child in below for row in _rows(profile, knapsack, chosen, child)]


def plan_checkpointing(
    model: nn.Module,
    example_inputs: Any,
    memory_budget: float | int,
    *,
    backend: Accelerator | str | None = None,
    selective: bool = True,
) -> CheckpointPlan:
    """Plan the checkpointing that fits ``memory_budget`` with the fastest step.

    Profiles forwards of ``model(*example_inputs)`` that keep none of the tensors
    autograd saves (:mod:`checkpointing._profile`), and times only checkpointed
    steps, never the plain one (:mod:`checkpointing._timed`): planning holds about
    what the chosen plan's own step holds, not the plain step's activations. The
    model's parameters, gradients, buffers and generator states are left as they were.
    A transformers KV cache (``config.use_cache``) is switched off, with a warning.

    Example::

        plan = plan_checkpointing(model, (x,), memory_budget=0.5)
        print(plan)          # module, grain, activations kept, recompute, decision
        plan.apply(model)

    Args:
        model: The model, on its device and in training mode, not yet checkpointed.
        example_inputs: A tuple of positional arguments for ``model`` (or a dict of
            keyword arguments), shaped like a training batch.
        memory_budget: Activation memory to allow: a float fraction of the plain
            model's (0 < b <= 1), or an int number of bytes.
        backend: The backend or its name; ``None`` means :func:`accel.get_backend`.
        selective: Consider operator-grain checkpointing besides whole modules: by
            operator class (recompute pointwise operators, dropout and normalisation
            inside a module; keep matmul and attention outputs), and by measured call
            (keep the calls that save the most recompute time per byte). Unavailable
            before torch 2.5. Whole modules and the saved-tensor grain (drop saved
            tensors that cheap operators recompute from kept ones, pack host dropout
            masks) are always considered.

    Returns:
        The plan; ``plan.apply(model)`` carries it out.

    Raises:
        TypeError: If ``memory_budget`` is not a float or an int, or
            ``example_inputs`` is not a tuple (or list) or a dict (a bare tensor ``x``
            is refused: pass ``(x,)``).
        ValueError: If ``memory_budget`` is out of range or below what checkpointing
            every candidate module reaches (the message gives the smallest reachable
            fraction), the model is in evaluation mode, no module can be checkpointed
            (the message says why), no model output requires grad, or ``example_inputs`` pass
            ``use_cache=True`` or a key-value cache (a transformers ``config.use_cache``
            that is ``True`` is instead set to ``False``, with a warning).
    """
    validate_budget(memory_budget)
    validate_planned(model, example_inputs)
    refuse_cache_inputs(example_inputs)
    switch_off_kv_cache(model)
    resolved = resolve_backend(backend)
    backend = accel.get_backend() if resolved is None else resolved
    device_start = _device_start(backend)
    note = ""
    reason = unavailable_reason() if selective else None
    if reason is not None:
        selective = False
        note = f"operator grain unavailable (whole modules and saved tensors only): {reason}."
    profile = profile_step(model, example_inputs, backend)
    plain = profile.plain_bytes
    budget = (
        math.floor(memory_budget * plain) if isinstance(memory_budget, float) else memory_budget
    )
    device = backend.device()
    unpriced = candidates(
        profile,
        selective,
        functools.cache(lambda geometry: pack_seconds(geometry, device, backend)),
    )
    overhead = selective_overhead(backend) if selective else (0.0, 0.0)
    options, set_aside = steady(profile, priced(unpriced, overhead))
    knapsack, chosen = _choose(profile, budget, options, memory_budget)
    base = reference(profile, options)
    timed = any(option.policy_calls for option in chosen.values())
    plans = [chosen, base] if timed else [base]
    rounds = [
        Rounds(tuple(seconds), _recompute(plan))
        for plan, seconds in zip(
            plans,
            measured_steps(model, example_inputs, backend, [_applier(profile, p) for p in plans])
            if base
            else [[] for _ in plans],
            strict=True,
        )
    ]
    profile.step_time = plain_step_time(profile, rounds[-1])
    if timed:
        missing = shortfall(rounds[0], rounds[1])
        if missing > 0:
            calls = sum(option.policy_calls for option in chosen.values())
            overhead = (overhead[0] + missing / calls, overhead[1])
            options, set_aside = steady(profile, priced(unpriced, overhead))
            knapsack, chosen = _choose(profile, budget, options, memory_budget)
    if selective:
        note = (
            f"selective policy overhead on this backend: {overhead[0] * 1e6:.1f} us per "
            f"operator call, {overhead[1] * 1e6:.1f} us more per kept call"
            + (" (a first plan timed in place)." if timed else ".")
        )
    if set_aside:
        note = (
            f"{note} {set_aside} options within the timing noise of checkpointing their "
            "module whole were set aside."
        ).strip()
    pool, best, target = _checked(model, example_inputs, backend, profile, budget, options, chosen)
    knapsack = Knapsack(profile, 0, options)
    plan = _plan(profile, knapsack, best.chosen, budget, note, pool, best, target)
    if device_start is None:
        return plan
    backend.synchronize()
    return replace(
        plan,
        device_bytes=backend.memory_allocated() - device_start,
        device_peak_bytes=backend.max_memory_allocated() - device_start,
    )


def _device_start(backend: Accelerator) -> int | None:
    """Bytes the device holds before planning (its peak counter reset), where it counts."""
    if not backend.supports_memory_stats:
        return None
    backend.synchronize()
    start = backend.memory_allocated()
    backend.reset_peak_memory_stats()
    return start


def _recompute(chosen: dict[str, Option]) -> float:
    return sum(option.seconds for option in chosen.values())


def _applier(profile: StepProfile, chosen: dict[str, Option]) -> Callable[[nn.Module], list[str]]:
    """``chosen`` as a function that applies it in place (for timing and measuring)."""
    return _plan(profile, Knapsack(profile, 0, {}), chosen, 0, "").apply


def _checked(
    model: nn.Module,
    example_inputs: Any,
    backend: Accelerator,
    profile: StepProfile,
    budget: int,
    options: dict[str, list[Option]],
    chosen: dict[str, Option],
) -> tuple[list[Candidate], Candidate, int]:
    """The considered plans, the one to take and the bytes they had to fit, checked in place.

    See :mod:`._candidates`.

    The fastest candidate that fits by estimate is applied and its activation bytes
    measured (:func:`._overhead.live_bytes`, above what the plain model's forward leaves
    alive, which the profile counted without holding it); if they exceed the budget,
    the overshoot is taken off the target and the choice made again (up to three
    times). Then, where checkpointing every repeated block whole also fits, both are
    timed in place in interleaved rounds (:mod:`._timed`), and every block whole is
    taken only if its step is at least 5% faster in every round; otherwise the
    estimate decides. Each candidate's ``reason`` says why it was or was not taken.
    """
    target = budget

    def held(choice: Candidate) -> int:
        measured = live_bytes(model, example_inputs, backend, _applier(profile, choice.chosen))
        return measured - profile.plain_live_bytes + profile.plain_bytes

    for _ in range(3):
        pool = [candidate(profile, "knapsack", chosen), *uniform_candidates(profile, options)]
        best = fastest_fitting(pool, target) or pool[0]
        over = held(best) - budget
        if over <= 0 or not best.chosen:
            break
        target -= over
        try:
            chosen = _choose(profile, target, options, target)[1]
        except ValueError:
            best.notes.append(f"measured {over} bytes over the budget")
            break
    _explain(pool, best, target, profile)
    full = next((c for c in pool if c.label == EVERY_BLOCK), None)
    if full is None or full is best or not full.fits(target):
        return pool, best, target
    timed = [
        Rounds(tuple(seconds), c.estimated_seconds)
        for c, seconds in zip(
            (best, full),
            measured_steps(
                model, example_inputs, backend, [_applier(profile, c.chosen) for c in (best, full)]
            ),
            strict=True,
        )
    ]
    best.measured_seconds = timed[0].median - profile.step_time
    full.measured_seconds = timed[1].median - profile.step_time
    decided, why = separated(timed[1], timed[0])
    if decided and held(full) <= budget:
        full.reason = f"taken: timed in place against the estimate's choice, {why}"
        best.reason = "not taken: every block whole was faster in every timed round"
        return pool, full, target
    best.reason += f"; timed in place against every block whole: {why}"
    full.reason = (
        "not taken: the timing did not separate it from the estimate's choice "
        f"({why}), so the estimate decides"
    )
    return pool, best, target


def _explain(pool: list[Candidate], best: Candidate, target: int, profile: StepProfile) -> None:
    """Say why each candidate was, or was not, the estimate's choice."""
    timings = ""
    if profile.noise > 0:
        timings = (
            f" (operator times: medians over {REPEATS} forwards, each within about "
            f"{profile.noise:.0%} of its true value, one standard deviation)"
        )
    for c in pool:
        if c is best:
            c.reason = "taken: the least estimated recompute time of the plans that fit" + timings
        elif not c.fits(target):
            c.reason = f"not taken: estimated {c.estimated_bytes - target} bytes over the budget"
        else:
            slower = (c.seconds - best.seconds) * 1e3
            c.reason = f"not taken: estimated {slower:.2f} ms more recompute than the one taken"


def _choose(
    profile: StepProfile,
    budget: int,
    options: dict[str, list[Option]],
    memory_budget: float | int,
) -> tuple[Knapsack, dict[str, Option]]:
    """The knapsack and its choice for ``budget`` bytes (raises if out of reach)."""
    plain = profile.plain_bytes
    chosen: dict[str, Option] | None = {}
    knapsack = Knapsack(profile, 0, options)
    need = plain - budget
    for _ in range(4):
        if need <= 0:
            break
        knapsack = Knapsack(profile, need, options)
        chosen = knapsack.solve()
        if chosen is None:
            break
        overshoot = estimate(profile, chosen) - budget
        if overshoot <= 0:
            break
        need += overshoot
    if chosen is None or estimate(profile, chosen) > budget:
        if not options:
            raise ValueError(f"checkpointing: {nothing_to_checkpoint(profile)}")
        fallback = knapsack.most_saving()
        smallest = estimate(profile, fallback)
        if smallest > budget:
            least = math.ceil(smallest / plain * 1000) / 1000
            raise ValueError(
                f"checkpointing: memory_budget={memory_budget!r} ({budget} bytes) is below "
                "what checkpointing can reach for this model (every module that can be "
                "checkpointed, at the grain that keeps the least): the smallest reachable is "
                f"{smallest / plain:.3f} of the plain activation memory ({smallest} of "
                f"{plain} bytes). Pass memory_budget >= {least}."
            )
        chosen = fallback
    return knapsack, _order(profile, chosen)


def _plan(
    profile: StepProfile,
    knapsack: Knapsack,
    chosen: dict[str, Option],
    budget: int,
    note: str,
    pool: list[Candidate] = (),  # type: ignore[assignment]
    taken: Candidate | None = None,
    target: int | None = None,
) -> CheckpointPlan:
    recompute = sum(option.seconds for option in chosen.values())
    considered = tuple(
        ConsideredPlan(
            c.label,
            c.estimated_bytes,
            c.estimated_seconds,
            c.measured_seconds,
            c.estimated_bytes <= (budget if target is None else target),
            c is taken,
            c.reason,
        )
        for c in pool
    )
    if taken is not None and taken.notes:
        note = f"{note} {'; '.join(taken.notes)}.".strip()
    return CheckpointPlan(
        considered=considered,
        decisions={name: option.decision for name, option in chosen.items()},
        rows=tuple(_rows(profile, knapsack, chosen)),
        plain_bytes=profile.plain_bytes,
        estimated_bytes=estimate(profile, chosen),
        estimated_step_time_ratio=(profile.step_time + recompute) / profile.step_time,
        budget_bytes=budget,
        step_seconds=profile.step_time,
        note=note,
        kept_calls={
            name: option.calls for name, option in chosen.items() if option.decision == MEASURED
        },
        saved_plans={
            name: saved_plan(profile, name, list(option.saved_units))
            for name, option in chosen.items()
            if option.decision == SAVED
        },
    )
