"""The planner's search: a multiple-choice knapsack over the module tree."""

from __future__ import annotations

import math

import torch

from ._options import Option
from ._profile import StepProfile

__all__ = ["BUCKETS", "Knapsack"]

BUCKETS = 1000
_ROWS = 32  # targets merged at once


class Knapsack:
    """Tree-shaped multiple-choice knapsack over the module tree.

    Minimises the total recompute time subject to the total saved bytes reaching
    ``need``, choosing at most one grain per module and never a module inside a
    chosen one. Savings are rounded down to ``BUCKETS`` units of ``need`` (so the
    choice never saves less than estimated), and each module keeps a table
    ``best[s]``: the least time for its subtree to save at least ``s`` units. Children
    are merged by min-plus convolution, so the cost is O(M * B^2) time and O(M * B)
    memory for M modules and B = ``BUCKETS`` (B^2 = 10^6 tensor operations per module
    with submodules).

    The unit is the same for every budget, so ``best[s]`` is one table whatever the
    budget: a looser budget needs fewer units and, the table never decreasing, never
    gets a plan with more estimated recompute time than a tighter one.
    """

    def __init__(self, profile: StepProfile, need: int, options: dict[str, list[Option]]) -> None:
        self.profile = profile
        self.unit = max(profile.plain_bytes / BUCKETS, 1.0)
        self.size = math.ceil(need / self.unit)
        self.options = options
        self.targets = torch.arange(self.size + 1)
        self.choice: dict[str, torch.Tensor] = {}
        self.splits: dict[str, list[torch.Tensor]] = {}

    def _merge(self, best: torch.Tensor, table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Min-plus convolution of two tables, ``_ROWS`` targets at a time.

        In slices, so that the search holds O(``_ROWS`` * B) bytes rather than O(B^2):
        planning's memory stays that of the steps it times (:mod:`._budget`).
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
        chosen: dict[str, Option] | None = None
        if not math.isinf(float(table[self.size])):
            chosen = {}
            self._collect("", self.size, chosen)
        # Free the tables before the planner times any step.
        self.choice.clear()
        self.splits.clear()
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
