"""The planner's search: the fastest combination of options that fits the budget.

:class:`Knapsack` solves a tree-shaped multiple-choice knapsack over the call tree
(at most one option per module call, never one inside a chosen one) for the least
weighed recompute seconds (below) that save at least ``s`` units of bytes, for every
``s`` at once. The units are the same for every budget (a thousandth of the plain step's
activation bytes), so one table answers every budget.

The knapsack adds each option's savings as if they were independent; the bytes a
combination really keeps (:func:`estimate`: the union of the storages that stay saved
or kept) can be more. :func:`search` therefore walks the table from the budget's
units upwards and takes the first combination whose estimate fits: the table never
decreasing, that is the fastest the table knows, and a looser budget, starting lower
with a looser test, never ends on a slower one (the tighter budget's plan is among its
candidates). Next to it stand plans a user would write by hand (:func:`uniform_candidates`:
every repeated block whole, or at one option they share), and the fastest fitting
candidate is taken. Everything here is arithmetic on the profile's estimates: the same
profile, options and budget give the same plan.

*Choice under uncertainty.* The cost model knows some grains' cost better than others':
a whole module recomputes exactly the operators it priced; the operator class adds a
policy per call; chosen calls rely on recorded occurrences; the saved-tensor grain adds
hooks, unpacking and a rebuilt graph that it prices least well. So the search weighs each
option at its estimate plus its grain's margin, ``seconds * (1 + GRAIN_MARGINS[grain])``,
and where weighed figures tie, it takes the coarser grain (:data:`COARSENESS`), and a
module's own option over a combination inside it. A finer option is taken only where it
is estimated faster by more than its margin; in particular a looser budget, whose plan
the table finds among cheaper combinations, switches a module to a finer grain only for
such a gain. The plan records the margins; its estimates are the unweighed ones.

*Repeated blocks* are sibling candidates of the same class with the same classes of
children, found from the top of the model down (a model's decoder layers, a ResNet's
residual blocks, a stack of a user's childless layers, the calls of one shared layer),
at the outermost level where they occur; a leaf counts only where checkpointing it
saves bytes (two embeddings side by side are not blocks).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from .._decisions import FULL
from ._grains import Grain, coarseness_order, grain_named, margins
from ._options import Option, nothing_to_checkpoint, storage_bytes
from ._records import StepProfile

__all__ = [
    "COARSENESS",
    "EVERY_BLOCK",
    "GRAIN_MARGINS",
    "Candidate",
    "Knapsack",
    "blocks",
    "candidate",
    "estimate",
    "search",
    "uniform_candidates",
    "weighed",
]

BUCKETS = 1000
_ROWS = 32  # targets merged at once

#: The grains, coarsest (cost best known) first: the order that breaks a tie. Each
#: grain states its place (its ``coarseness``, :mod:`._grains`).
COARSENESS = coarseness_order()

#: Each grain's margin: how far, relative to its own estimate, its recompute time may be
#: off beyond the error all grains share (the operators' rates). Stated by each grain,
#: not fitted: on the CPU zoo (benchmarks/results/budget-cpu-20261128.json) plans of the
#: saved-tensor grain measured several times their estimated recompute, and the
#: policies' overhead per call is calibrated once per device. See
#: docs/memory-budget-planning.md, "How it decides".
GRAIN_MARGINS: dict[str, float] = margins()


def _grain(option: Option) -> Grain[Any]:
    grain = grain_named(option.decision)
    assert grain is not None, option.decision  # options come from registered grains
    return grain


def weighed(option: Option) -> float:
    """The seconds the search weighs ``option`` at: its estimate plus its grain's margin."""
    return option.seconds * (1.0 + _grain(option).margin)


def _coarseness(option: Option) -> int:
    return coarseness_order().index(option.decision)


class Knapsack:
    """Tree-shaped multiple-choice knapsack over the module tree.

    Minimises the total weighed recompute time (:func:`weighed`) subject to the total
    saved bytes reaching ``s`` units, for every ``s`` up to the plain step's bytes,
    choosing at most one grain per module call and never one inside a chosen one.
    Savings are rounded down to units of a ``BUCKETS``-th of the plain bytes (so the
    choice never saves less than estimated), and each call keeps a table ``best[s]``:
    the least time for its subtree to save at least ``s`` units (on a tie the coarser
    grain, and a call's own option over a combination inside it). Children are merged
    by min-plus convolution, so the cost is O(M * B^2) time and O(M * B) memory for M
    calls and B = ``BUCKETS`` (B^2 = 10^6 tensor operations per call with calls inside).

    The unit is the same for every budget, so ``best[s]`` is one table whatever the
    budget: a looser budget needs fewer units and, the table never decreasing, never
    gets a plan with more estimated recompute time than a tighter one.
    """

    def __init__(self, profile: StepProfile, options: dict[str, list[Option]]) -> None:
        self.profile = profile
        self.unit = max(profile.plain_bytes / BUCKETS, 1.0)
        self.size = BUCKETS
        self.options = options
        self.targets = torch.arange(self.size + 1)
        self.choice: dict[str, torch.Tensor] = {}
        self.splits: dict[str, list[torch.Tensor]] = {}
        self.table = self._solve("")

    def _merge(self, best: torch.Tensor, table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Min-plus convolution of two tables, ``_ROWS`` targets at a time.

        In slices, so that the search holds O(``_ROWS`` * B) bytes rather than O(B^2).
        """
        merged = torch.empty_like(best)
        split = torch.empty(best.shape, dtype=torch.long)
        targets = self.targets
        for start in range(0, len(targets), _ROWS):
            rows = targets[start : start + _ROWS]
            # rest[s, a]: what the next child must save when the others save a.
            rest = (rows.unsqueeze(1) - targets.unsqueeze(0)).clamp(min=0)
            merged[start : start + _ROWS], split[start : start + _ROWS] = (
                best.unsqueeze(0) + table[rest]
            ).min(dim=1)
        return merged, split

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
            best, split = self._merge(best, table)
            splits.append(split)
        self.splits[name] = splits
        choice = torch.full((size + 1,), -1, dtype=torch.long)
        # The grain of each entry, for ties: a combination inside ranks below every grain.
        rank = torch.full((size + 1,), len(coarseness_order()), dtype=torch.long)
        for number, option in enumerate(self.options.get(name, [])):
            units = min(math.floor(option.saved_bytes / self.unit), size)
            if units <= 0:
                continue
            seconds, level, head = weighed(option), _coarseness(option), slice(1, units + 1)
            better = (best[head] > seconds) | ((best[head] == seconds) & (rank[head] > level))
            best[head] = torch.where(better, seconds, best[head])
            choice[head] = torch.where(better, number, choice[head])
            rank[head] = torch.where(better, level, rank[head])
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

    def units(self, need: int) -> int:
        """The table's units for saving at least ``need`` bytes."""
        return min(max(math.ceil(need / self.unit), 0), self.size)

    def seconds(self, units: int) -> float:
        """The least weighed recompute seconds that save ``units``; inf if none does."""
        return float(self.table[units])

    def chosen(self, units: int) -> dict[str, Option]:
        """The options that save ``units`` in :meth:`seconds`, by module call."""
        chosen: dict[str, Option] = {}
        self._collect("", units, chosen)
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


EVERY_BLOCK = "every block: checkpoint"


@dataclass
class Candidate:
    """One whole-model plan: which option each module takes, and what it costs."""

    label: str
    chosen: dict[str, Option]
    estimated_bytes: int
    estimated_seconds: float
    notes: list[str] = field(default_factory=list)
    reason: str = ""  # why the planner took it or not (ConsideredPlan.reason)

    def fits(self, budget: int) -> bool:
        return self.estimated_bytes <= budget

    @property
    def seconds(self) -> float:
        """The estimated recompute seconds."""
        return self.estimated_seconds

    @property
    def weighed_seconds(self) -> float:
        """The recompute seconds with each grain's margin (:func:`weighed`)."""
        return sum(weighed(option) for option in self.chosen.values())

    @property
    def fineness(self) -> int:
        """How fine its grains are: the sum of their places in :data:`COARSENESS`."""
        return sum(_coarseness(option) for option in self.chosen.values())


def estimate(profile: StepProfile, chosen: dict[str, Option]) -> int:
    """Activation bytes with ``chosen`` applied: union of what stays saved and kept."""
    kept: set[int] = set()
    for index, stacks in profile.saved_by.items():
        if not all(chosen.keys() & set(stack) for stack in stacks):
            kept.add(index)
    for option in chosen.values():
        kept |= option.kept
    return storage_bytes(profile, kept) + sum(option.extra_bytes for option in chosen.values())


def candidate(profile: StepProfile, label: str, chosen: dict[str, Option]) -> Candidate:
    """``chosen`` as a :class:`Candidate` with its estimated bytes and seconds."""
    seconds = sum(option.seconds for option in chosen.values())
    return Candidate(label, dict(chosen), estimate(profile, chosen), seconds)


def _signature(profile: StepProfile, name: str) -> tuple[str, tuple[str, ...]]:
    record = profile.modules[name]
    return record.kind, record.child_kinds


def _block_like(profile: StepProfile, options: dict[str, list[Option]], name: str) -> bool:
    """A candidate with submodules, or a leaf whose checkpoint saves bytes (not embeddings)."""
    if name not in options:
        return False
    return bool(profile.modules[name].children) or _full(options[name]).saved_bytes > 0


def blocks(profile: StepProfile, options: dict[str, list[Option]], name: str = "") -> list[str]:
    """The repeated blocks below ``name`` (see the module docstring), in visiting order."""
    children = profile.modules[name].children
    eligible = {child for child in children if _block_like(profile, options, child)}
    counts = Counter(_signature(profile, child) for child in eligible)
    found: list[str] = []
    for child in children:
        if child in eligible and counts[_signature(profile, child)] > 1:
            found.append(child)
        else:
            found.extend(blocks(profile, options, child))
    return found


def uniform_candidates(profile: StepProfile, options: dict[str, list[Option]]) -> list[Candidate]:
    """Every repeated block at the same option: whole, and each option the blocks share."""
    names = blocks(profile, options)
    if not names:
        return []
    found = [candidate(profile, EVERY_BLOCK, {n: _full(options[n]) for n in names})]
    for number in range(min(len(options[n]) for n in names)):
        picked = {n: options[n][number] for n in names}
        shapes = {(o.decision, o.kind) for o in picked.values()}
        first = next(iter(picked.values()))
        if len(shapes) == 1 and first.decision != FULL:
            found.append(candidate(profile, f"every block: {first.kind}", picked))
    return found


def _full(module_options: list[Option]) -> Option:
    return next(option for option in module_options if option.decision == FULL)


def _fastest_fitting(candidates: list[Candidate], budget: int) -> Candidate | None:
    """The fitting candidate with the least weighed seconds (a tie: the coarser, the first)."""
    fitting = [c for c in candidates if c.fits(budget)]
    return min(fitting, key=lambda c: (c.weighed_seconds, c.fineness)) if fitting else None


def search(
    profile: StepProfile,
    options: dict[str, list[Option]],
    budget: int,
    memory_budget: float | int,
) -> tuple[list[Candidate], Candidate]:
    """The candidates weighed for ``budget`` bytes, and the one taken (see the docstring).

    Raises:
        ValueError: If no module can be checkpointed, or no combination fits the
            budget (the message names the smallest fraction that fits).
    """
    plain = profile.plain_bytes
    if not options:
        raise ValueError(f"checkpointing: {nothing_to_checkpoint(profile)}")
    knapsack = Knapsack(profile, options)
    chosen: dict[str, Option] | None = None
    smallest = plain
    for units in range(knapsack.units(plain - budget), knapsack.size + 1):
        if math.isinf(knapsack.seconds(units)):
            break
        found = knapsack.chosen(units)
        held = estimate(profile, found)
        smallest = min(smallest, held)
        if held <= budget:
            chosen = found
            break
    pool = uniform_candidates(profile, options)
    if chosen is not None:
        pool.insert(0, candidate(profile, "knapsack", _order(profile, chosen)))
    best = _fastest_fitting(pool, budget)
    if best is None:
        most = estimate(profile, knapsack.most_saving())
        smallest = min([smallest, most, *(c.estimated_bytes for c in pool)])
        least = math.ceil(smallest / plain * 1000) / 1000
        raise ValueError(
            f"checkpointing: memory_budget={memory_budget!r} ({budget} bytes) is below "
            "what checkpointing can reach for this model (every module call that can be "
            "checkpointed, at the grain that keeps the least): the smallest reachable is "
            f"{smallest / plain:.3f} of the plain activation memory ({smallest} of "
            f"{plain} bytes). Pass memory_budget >= {least}."
        )
    _explain(pool, best, budget)
    return pool, best


def _order(profile: StepProfile, chosen: dict[str, Option]) -> dict[str, Option]:
    order = list(profile.modules)
    return {name: chosen[name] for name in sorted(chosen, key=order.index)}


def _explain(pool: list[Candidate], best: Candidate, budget: int) -> None:
    """Say why each candidate was, or was not, taken."""
    for c in pool:
        if c is best:
            c.reason = (
                "taken: the least estimated recompute time, with each grain's margin, of "
                "the plans that fit"
            )
        elif not c.fits(budget):
            c.reason = f"not taken: estimated {c.estimated_bytes - budget} bytes over the budget"
        else:
            slower = (c.seconds - best.seconds) * 1e3
            weighed_slower = (c.weighed_seconds - best.weighed_seconds) * 1e3
            c.reason = (
                f"not taken: estimated {slower:.2f} ms more recompute than the one taken "
                f"({weighed_slower:.2f} ms with each grain's margin; on a tie, the coarser)"
            )
