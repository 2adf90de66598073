"""``plan_checkpointing``: the fastest checkpointing that fits a memory budget.

From one profiled step (:mod:`._profile`), every module that runs once per step and
has submodules is a candidate at three grains: the whole module (keep only its
inputs); its cheap operators by class (keep its inputs and its matmul and attention
outputs, recompute pointwise activations, dropout and normalisation); and its
operator calls by measured cost (keep the calls that save the most recompute time per
byte, :mod:`._kept_ops`; this is what keeps a host's dropout masks, whose random
draws cost more than the matmuls around them). Each choice saves some activation
bytes and costs some recompute time; :class:`_Knapsack` picks the set that saves
enough for the budget in the least time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import accel
from accel import Accelerator
from accel._compat import selective_cache_allows_mutation

from ._args import resolve_backend, validate_budget
from ._kept_ops import Unit, find_units, keep_options
from ._overhead import measured_step_ratio, selective_overhead
from ._plan import FULL, KEEP, MEASURED, SELECTIVE, CheckpointPlan, PlanRow
from ._profile import StepProfile, profile_step
from ._selective import unavailable_reason

__all__ = ["plan_checkpointing"]

_BUCKETS = 1000


@dataclass(frozen=True)
class _Option:
    decision: str
    saved_bytes: int  # activation bytes removed (negative: added)
    seconds: float
    kept: frozenset[int]
    kind: str = "module"
    calls: tuple[tuple[str, int], ...] = ()


def _bytes(profile: StepProfile, indices: Iterable[int]) -> int:
    return sum(profile.storage_bytes[index] for index in set(indices))


def _estimate(profile: StepProfile, chosen: dict[str, _Option]) -> int:
    """Activation bytes with ``chosen`` applied: union of what stays saved and kept."""
    kept: set[int] = set()
    for index, stacks in profile.saved_by.items():
        if not all(chosen.keys() & set(stack) for stack in stacks):
            kept.add(index)
    for option in chosen.values():
        kept |= option.kept
    return _bytes(profile, kept)


def _kept_summary(units: list[Unit]) -> str:
    """``ops kept: addmm x3, bernoulli_ x2``: what a measured option keeps, by label."""
    counts: dict[str, int] = {}
    for unit in units:
        counts[unit.label] = counts.get(unit.label, 0) + 1
    shown = [f"{label} x{count}" if count > 1 else label for label, count in counts.items()]
    return "ops kept: " + ", ".join(shown)


def _options(
    profile: StepProfile, name: str, selective: bool, overhead: tuple[float, float]
) -> list[_Option]:
    """The ways to checkpoint module ``name``, with their exclusive savings.

    A selective option's recompute time is the module's forward time, less the own
    time of the operators it keeps, plus the policy's ``overhead`` (per call, per kept
    call; :mod:`._overhead`).
    """
    record = profile.modules[name]
    owned = {
        index
        for index, stacks in profile.saved_by.items()
        if all(name in stack for stack in stacks)
    }
    grains = [_Option(FULL, 0, record.forward_time, frozenset(record.inputs))]
    if selective:
        per_call, per_kept = overhead
        policy = per_call * len(record.ops)
        kept = frozenset(record.inputs | record.cached)
        kind = "ops: pointwise, dropout, norm"
        seconds = record.recomputed_time + policy + per_kept * len(record.cached)
        grains.append(_Option(SELECTIVE, 0, seconds, kept, kind))
        units = find_units(record.ops, selective_cache_allows_mutation())
        for prefix in keep_options(units, profile.storage_bytes, record.inputs):
            chosen = [units[number] for number in prefix]
            calls = sum(len(unit.calls) for unit in chosen)
            own = sum(unit.seconds for unit in chosen)
            grains.append(
                _Option(
                    MEASURED,
                    0,
                    max(record.forward_time - own, 0.0) + policy + per_kept * calls,
                    frozenset(record.inputs).union(*(unit.storages for unit in chosen)),
                    _kept_summary(chosen),
                    tuple(sorted(call for unit in chosen for call in unit.calls)),
                )
            )
    options = []
    for grain in grains:
        kept = grain.kept
        saved = _bytes(profile, owned - kept) - _bytes(profile, kept - profile.saved_by.keys())
        options.append(_Option(grain.decision, saved, grain.seconds, kept, grain.kind, grain.calls))
    return options


def _is_candidate(profile: StepProfile, name: str) -> bool:
    record = profile.modules[name]
    return bool(name) and record.calls == 1 and bool(record.children) and not record.repeated_input


class _Knapsack:
    """Tree-shaped multiple-choice knapsack over the module tree.

    Minimises the total recompute time subject to the total saved bytes reaching
    ``need``, choosing at most one grain per module and never a module inside a
    chosen one. Savings are rounded down to ``_BUCKETS`` units of ``need`` (so the
    choice never saves less than estimated), and each module keeps a table
    ``best[s]``: the least time for its subtree to save at least ``s`` units. Children
    are merged by min-plus convolution, so the cost is O(M * B^2) time and O(M * B)
    memory for M modules and B = ``_BUCKETS`` (B^2 = 10^6 tensor operations per module
    with submodules).
    """

    def __init__(
        self,
        profile: StepProfile,
        need: int,
        selective: bool,
        overhead: tuple[float, float] = (0.0, 0.0),
    ) -> None:
        self.profile = profile
        self.unit = max(need / _BUCKETS, 1.0)
        self.size = math.ceil(need / self.unit)
        self.options = {
            name: _options(profile, name, selective, overhead)
            for name in profile.modules
            if _is_candidate(profile, name)
        }
        targets = torch.arange(self.size + 1)
        # rest[s, a]: what the next child must save when the others save a, for s in all.
        self.rest = (targets.unsqueeze(1) - targets.unsqueeze(0)).clamp(min=0)
        self.choice: dict[str, torch.Tensor] = {}
        self.splits: dict[str, list[torch.Tensor]] = {}

    def _solve(self, name: str) -> torch.Tensor:
        size = self.size
        best = torch.full((size + 1,), math.inf, dtype=torch.float64)
        best[0] = 0.0
        splits = []
        for child in self.profile.modules[name].children:
            table = self._solve(child)
            if math.isinf(float(table[1])):  # the child saves nothing: skip the merge
                splits.append(torch.full((size + 1,), -1, dtype=torch.long))
                continue
            merged, split = (best.unsqueeze(0) + table[self.rest]).min(dim=1)
            best = merged
            splits.append(split)
        self.splits[name] = splits
        choice = torch.full((size + 1,), -1, dtype=torch.long)
        for number, option in enumerate(self.options.get(name, [])):
            units = min(math.floor(option.saved_bytes / self.unit), size)
            if units <= 0:
                continue
            better = best[: units + 1] > option.seconds
            best[: units + 1] = torch.where(better, option.seconds, best[: units + 1])
            choice[: units + 1] = torch.where(better, number, choice[: units + 1])
        self.choice[name] = choice
        return best

    def _collect(self, name: str, units: int, chosen: dict[str, _Option]) -> None:
        number = int(self.choice[name][units])
        if number >= 0:
            chosen[name] = self.options[name][number]
            return
        children = self.profile.modules[name].children
        for child, split in reversed(list(zip(children, self.splits[name], strict=True))):
            if int(split[units]) < 0:
                continue
            share = int(split[units])
            self._collect(child, max(units - share, 0), chosen)
            units = share

    def solve(self) -> dict[str, _Option] | None:
        """The chosen option per module, or ``None`` if no choice saves enough."""
        table = self._solve("")
        if math.isinf(float(table[self.size])):
            return None
        chosen: dict[str, _Option] = {}
        self._collect("", self.size, chosen)
        return chosen

    def most_saving(self, name: str = "") -> dict[str, _Option]:
        """The choice that saves the most bytes (ignoring time)."""
        below: dict[str, _Option] = {}
        for child in self.profile.modules[name].children:
            below.update(self.most_saving(child))
        total = sum(option.saved_bytes for option in below.values())
        options = sorted(self.options.get(name, []), key=lambda o: (-o.saved_bytes, o.seconds))
        if options and options[0].saved_bytes > total:
            return {name: options[0]}
        return below


def _order(profile: StepProfile, chosen: dict[str, _Option]) -> dict[str, _Option]:
    order = list(profile.modules)
    return {name: chosen[name] for name in sorted(chosen, key=order.index)}


def _frontier(profile: StepProfile, knapsack: _Knapsack, name: str) -> list[str]:
    """The candidates below ``name`` reached through non-candidates only."""
    found = []
    for child in profile.modules[name].children:
        if child in knapsack.options:
            found.append(child)
        else:
            found.extend(_frontier(profile, knapsack, child))
    return found


def _rows(
    profile: StepProfile, knapsack: _Knapsack, chosen: dict[str, _Option], name: str = ""
) -> list[PlanRow]:
    """One row per chosen module, and per kept module at the level of repeated blocks."""
    if name in chosen:
        option = chosen[name]
        kept = _bytes(profile, option.kept)
        return [PlanRow(name, option.kind, option.decision, kept, option.seconds)]
    below = _frontier(profile, knapsack, name)
    inside = any(other.startswith(f"{name}.") for other in chosen)
    repeated = len(below) > 1 and len({profile.modules[b].kind for b in below}) == 1
    if name in knapsack.options and not inside and not repeated:
        owned = [
            index
            for index, stacks in profile.saved_by.items()
            if all(name in stack for stack in stacks)
        ]
        return [PlanRow(name, "module", KEEP, _bytes(profile, owned), 0.0)]
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

    Runs one warm-up step, one recorded forward and two timed steps of
    ``model(*example_inputs)`` (see :mod:`checkpointing._profile`); the model's
    parameters, gradients, buffers and generator states are left as they were.

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
            before torch 2.5.

    Returns:
        The plan; ``plan.apply(model)`` carries it out.

    Raises:
        TypeError: If ``memory_budget`` is not a float or an int.
        ValueError: If ``memory_budget`` is out of range or below what checkpointing
            every candidate module reaches (the message gives the smallest reachable
            fraction), or no model output requires grad.
    """
    validate_budget(memory_budget)
    if not isinstance(example_inputs, tuple | list | dict):
        example_inputs = (example_inputs,)
    resolved = resolve_backend(backend)
    backend = accel.get_backend() if resolved is None else resolved
    note = ""
    reason = unavailable_reason() if selective else None
    if reason is not None:
        selective, note = False, f"operator grain unavailable, whole modules only: {reason}."
    profile = profile_step(model, example_inputs, backend)
    plain = profile.plain_bytes
    budget = (
        math.floor(memory_budget * plain) if isinstance(memory_budget, float) else memory_budget
    )
    overhead = (0.0, 0.0)
    if selective:
        overhead = selective_overhead(backend)
    knapsack, chosen = _choose(profile, budget, selective, overhead, memory_budget)
    if any(option.decision != FULL for option in chosen.values()):
        draft = _plan(profile, knapsack, chosen, budget, "")
        measured = measured_step_ratio(model, example_inputs, backend, draft.apply)
        calls = sum(
            len(profile.modules[name].ops)
            for name, option in chosen.items()
            if option.decision != FULL
        )
        missing = (measured - draft.estimated_step_time_ratio) * profile.step_time
        if missing > 0:
            overhead = (overhead[0] + missing / calls, overhead[1])
            knapsack, chosen = _choose(profile, budget, selective, overhead, memory_budget)
    if selective:
        note = (
            f"selective policy overhead on this backend: {overhead[0] * 1e6:.1f} us per "
            f"operator call, {overhead[1] * 1e6:.1f} us more per kept call (a first plan "
            "timed in place)."
        )
    return _plan(profile, knapsack, chosen, budget, note)


def _choose(
    profile: StepProfile,
    budget: int,
    selective: bool,
    overhead: tuple[float, float],
    memory_budget: float | int,
) -> tuple[_Knapsack, dict[str, _Option]]:
    """The knapsack and its choice for ``budget`` bytes (raises if out of reach)."""
    plain = profile.plain_bytes
    chosen: dict[str, _Option] | None = {}
    knapsack = _Knapsack(profile, 0, selective, overhead)
    need = plain - budget
    for _ in range(4):
        if need <= 0:
            break
        knapsack = _Knapsack(profile, need, selective, overhead)
        chosen = knapsack.solve()
        if chosen is None:
            break
        overshoot = _estimate(profile, chosen) - budget
        if overshoot <= 0:
            break
        need += overshoot
    if chosen is None or _estimate(profile, chosen) > budget:
        fallback = knapsack.most_saving()
        smallest = _estimate(profile, fallback)
        if smallest > budget:
            least = math.ceil(smallest / plain * 1000) / 1000
            raise ValueError(
                f"checkpointing: memory_budget={memory_budget!r} ({budget} bytes) is below "
                "what checkpointing can reach for this model: the smallest reachable is "
                f"{smallest / plain:.3f} of the plain activation memory ({smallest} of "
                f"{plain} bytes). Pass memory_budget >= {least}."
            )
        chosen = fallback
    return knapsack, _order(profile, chosen)


def _plan(
    profile: StepProfile,
    knapsack: _Knapsack,
    chosen: dict[str, _Option],
    budget: int,
    note: str,
) -> CheckpointPlan:
    recompute = sum(option.seconds for option in chosen.values())
    return CheckpointPlan(
        decisions={name: option.decision for name, option in chosen.items()},
        rows=tuple(_rows(profile, knapsack, chosen)),
        plain_bytes=profile.plain_bytes,
        estimated_bytes=_estimate(profile, chosen),
        estimated_step_time_ratio=(profile.step_time + recompute) / profile.step_time,
        budget_bytes=budget,
        step_seconds=profile.step_time,
        device_bytes=profile.device_bytes,
        device_peak_bytes=profile.device_peak_bytes,
        note=note,
        kept_calls={
            name: option.calls for name, option in chosen.items() if option.decision == MEASURED
        },
    )
