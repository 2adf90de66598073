"""The chosen-calls grain: which operator outputs a selective checkpoint keeps.

From a module's profiled operator calls (:class:`._profile.OpCall`) the outputs that
can be kept come in *units*: an operator call that creates storage, together with the
in-place calls that later write into it. Dropout on the host is one unit of three
calls: ``empty_like``, ``bernoulli_`` and ``div_``. Keeping a unit means none of its
calls runs again in backward, and the recomputation reads the kept storage as the
forward left it. Three rules keep that exact:

* a unit whose storage another operator reads (not merely views) before the unit's
  last in-place write cannot be kept: the recomputation would read the final value
  too early;
* a unit written in place by a call outside it cannot be kept, nor can a call that
  writes into a module input or creates storage while writing elsewhere;
* units that draw random numbers are kept as a suffix: once one is kept, every later
  draw in the module is kept too. The recomputation restores the generator and replays
  the draws in order; a skipped draw followed by a replayed one would shift the
  replayed one's numbers. A draw that cannot be kept bars every draw before it.

Keeping in-place units needs torch's ``allow_cache_entry_mutation``; without it
(:func:`accel._compat.selective_cache_allows_mutation`) only units without in-place
writes are kept.

:func:`keep_options` orders the units greedily by recompute time saved per byte kept
(the random suffix grows as one choice of several draws) and returns every prefix as an
option for the planner's knapsack. Greedy is O(U^2) for U units; its prefixes are the
points of the module's time-memory curve the knapsack chooses among.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .._replay import operator_label
from ._records import OpCall

__all__ = ["Unit", "find_units", "keep_options"]


@dataclass
class Unit:
    """Calls whose outputs are kept together, and what keeping them saves."""

    calls: list[tuple[str, int]]
    storages: frozenset[int]
    seconds: float
    random: bool
    label: str
    keepable: bool = True
    read_by_others: bool = False
    writes: list[str] = field(default_factory=list)


def find_units(calls: Sequence[OpCall], mutable_cache: bool) -> list[Unit]:
    """Group a module's operator calls into units, marking those that may be kept.

    Args:
        calls: The module's operator calls in forward order.
        mutable_cache: Whether kept storages may be written in place later in the
            forward (torch's ``allow_cache_entry_mutation``).

    Returns:
        The units in the order of their first call; ``keepable`` says which the rules
        of this module's docstring allow to be kept.
    """
    units: list[Unit] = []
    owner: dict[int, int] = {}
    barrier = 0  # random units before this index cannot be kept
    for call in calls:
        targets = {owner.get(index) for index in call.mutated}
        chained = (
            bool(call.mutated) and not call.fresh and len(targets) == 1 and None not in targets
        )
        if chained:
            unit = units[next(iter(targets))]  # type: ignore[index]
            unit.calls.append((call.name, call.occurrence))
            unit.seconds += call.seconds
            unit.writes.append(operator_label(call.name))
            if call.random:
                unit.random = True
                unit.label = operator_label(call.name)
            if unit.read_by_others or not mutable_cache:
                unit.keepable = False
            if call.random and not unit.keepable:
                barrier = len(units)
            continue
        for target in targets:
            if target is not None:
                units[target].keepable = False
        if call.mutated and call.random:
            barrier = len(units)
        if call.fresh or call.mutated:  # a view reads nothing; it only aliases
            for index in call.read:
                if index in owner and index not in call.fresh:
                    units[owner[index]].read_by_others = True
        if call.fresh:
            for index in call.fresh:
                owner[index] = len(units)
            units.append(
                Unit(
                    calls=[(call.name, call.occurrence)],
                    storages=frozenset(call.fresh),
                    seconds=call.seconds,
                    random=call.random,
                    label=operator_label(call.name),
                    keepable=not call.mutated,
                )
            )
    for number, unit in enumerate(units):
        if unit.random and not unit.keepable:
            barrier = max(barrier, number + 1)
    for number, unit in enumerate(units):
        if unit.random and number < barrier:
            unit.keepable = False
    return units


def keep_options(
    units: Sequence[Unit], storage_bytes: dict[int, int], kept_anyway: set[int]
) -> list[list[int]]:
    """Greedy prefixes of units to keep, most recompute time saved per byte first.

    Args:
        units: The module's units (:func:`find_units`).
        storage_bytes: Bytes per storage id.
        kept_anyway: Storages the checkpoint keeps in any case (the module's inputs):
            keeping them costs nothing more.

    Returns:
        Each prefix as a list of unit indices; the first keeps one choice, the last
        every unit worth keeping.
    """
    plain = [n for n, u in enumerate(units) if u.keepable and not u.random and u.seconds > 0]
    draws = [n for n, u in enumerate(units) if u.keepable and u.random]
    start = len(draws)  # draws[start:] are kept
    kept = set(kept_anyway)
    chosen: list[int] = []
    options: list[list[int]] = []

    def cost(group: Sequence[int]) -> int:
        storages = set().union(*(units[n].storages for n in group)) - kept
        return sum(storage_bytes[index] for index in storages)

    while True:
        choices = [[n] for n in plain if n not in chosen]
        choices += [draws[first:start] for first in range(start)]
        best: tuple[float, int, list[int]] | None = None
        for group in choices:
            seconds = sum(units[n].seconds for n in group)
            size = cost(group)
            ratio = seconds / size if size > 0 else float("inf")
            if best is None or (ratio, -size) > (best[0], -best[1]):
                best = (ratio, size, group)
        if best is None:
            return options
        group = best[2]
        if group and units[group[0]].random:
            start = draws.index(group[0])
        chosen.extend(group)
        for n in group:
            kept |= units[n].storages
        options.append(sorted(chosen))
