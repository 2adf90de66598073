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
bytes and costs some recompute time; :class:`_Knapsack` picks the set that saves
enough for the budget in the least time.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
from torch import nn

import accel
from accel import Accelerator

from ._args import resolve_backend, validate_budget
from ._options import Option, candidates, priced, storage_bytes
from ._overhead import measured_step_ratio, pack_seconds, selective_overhead
from ._plan import KEEP, MEASURED, SAVED, CheckpointPlan, PlanRow
from ._profile import StepProfile, profile_step
from ._saved_grain import saved_plan
from ._selective import unavailable_reason

__all__ = ["plan_checkpointing"]

_BUCKETS = 1000


def _estimate(profile: StepProfile, chosen: dict[str, Option]) -> int:
    """Activation bytes with ``chosen`` applied: union of what stays saved and kept."""
    kept: set[int] = set()
    for index, stacks in profile.saved_by.items():
        if not all(chosen.keys() & set(stack) for stack in stacks):
            kept.add(index)
    for option in chosen.values():
        kept |= option.kept
    return storage_bytes(profile, kept) + sum(option.extra_bytes for option in chosen.values())


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

    def __init__(self, profile: StepProfile, need: int, options: dict[str, list[Option]]) -> None:
        self.profile = profile
        self.unit = max(need / _BUCKETS, 1.0)
        self.size = math.ceil(need / self.unit)
        self.options = options
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

    def _collect(self, name: str, units: int, chosen: dict[str, Option]) -> None:
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

    def solve(self) -> dict[str, Option] | None:
        """The chosen option per module, or ``None`` if no choice saves enough."""
        table = self._solve("")
        if math.isinf(float(table[self.size])):
            return None
        chosen: dict[str, Option] = {}
        self._collect("", self.size, chosen)
        return chosen

    def most_saving(self, name: str = "") -> dict[str, Option]:
        """The choice that saves the most bytes (ignoring time)."""
        below: dict[str, Option] = {}
        for child in self.profile.modules[name].children:
            below.update(self.most_saving(child))
        total = sum(option.saved_bytes for option in below.values())
        options = sorted(self.options.get(name, []), key=lambda o: (-o.saved_bytes, o.seconds))
        if options and options[0].saved_bytes > total:
            return {name: options[0]}
        return below


def _order(profile: StepProfile, chosen: dict[str, Option]) -> dict[str, Option]:
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
    profile: StepProfile, knapsack: _Knapsack, chosen: dict[str, Option], name: str = ""
) -> list[PlanRow]:
    """One row per chosen module, and per kept module at the level of repeated blocks."""
    if name in chosen:
        option = chosen[name]
        kept = storage_bytes(profile, option.kept) + option.extra_bytes
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
            before torch 2.5. Whole modules and the saved-tensor grain (drop saved
            tensors that cheap operators recompute from kept ones, pack host dropout
            masks) are always considered.

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
    knapsack, chosen = _choose(profile, budget, priced(unpriced, overhead), memory_budget)
    timed = any(option.policy_calls for option in chosen.values())
    if timed:
        draft = _plan(profile, knapsack, chosen, budget, "")
        measured = measured_step_ratio(model, example_inputs, backend, draft.apply)
        calls = sum(option.policy_calls for option in chosen.values())
        missing = (measured - draft.estimated_step_time_ratio) * profile.step_time
        if missing > 0:
            overhead = (overhead[0] + missing / calls, overhead[1])
            options = priced(unpriced, overhead)
            knapsack, chosen = _choose(profile, budget, options, memory_budget)
    if selective:
        note = (
            f"selective policy overhead on this backend: {overhead[0] * 1e6:.1f} us per "
            f"operator call, {overhead[1] * 1e6:.1f} us more per kept call"
            + (" (a first plan timed in place)." if timed else ".")
        )
    return _plan(profile, knapsack, chosen, budget, note)


def _choose(
    profile: StepProfile,
    budget: int,
    options: dict[str, list[Option]],
    memory_budget: float | int,
) -> tuple[_Knapsack, dict[str, Option]]:
    """The knapsack and its choice for ``budget`` bytes (raises if out of reach)."""
    plain = profile.plain_bytes
    chosen: dict[str, Option] | None = {}
    knapsack = _Knapsack(profile, 0, options)
    need = plain - budget
    for _ in range(4):
        if need <= 0:
            break
        knapsack = _Knapsack(profile, need, options)
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
    chosen: dict[str, Option],
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
        saved_plans={
            name: saved_plan(profile, name, list(option.saved_units))
            for name, option in chosen.items()
            if option.decision == SAVED
        },
    )
