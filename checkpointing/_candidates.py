"""Whole-model plans the planner weighs against each other, so that none beats its choice.

The knapsack (:mod:`._budget`) adds up each module's savings as if they were
independent and rounds them to buckets; the bytes a combination really keeps
(:func:`estimate`: the union of the storages that stay saved or kept) can differ from
that sum, and so the knapsack's answer can lose to a simpler plan it never compared
itself with. This module lists those plans next to the knapsack's choice:

* every repeated block checkpointed whole (what a user would write by hand, and
  torch's per-block checkpointing);
* every repeated block at the same option, for each option the blocks share (the
  same saved-tensor prefix, the same selective policy);

and :func:`fastest_fitting` picks the fastest candidate whose estimated bytes fit the
budget. *Repeated blocks* are sibling candidate modules of the same class with the
same classes of children, found from the top of the model down (a model's decoder
layers, a ResNet's residual blocks, a stack of a user's childless layers), at the
outermost level where they occur; a leaf counts only where checkpointing it saves bytes
(two embeddings side by side are not blocks).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ._decisions import FULL
from ._options import Option, storage_bytes
from ._profile import StepProfile

__all__ = [
    "EVERY_BLOCK",
    "Candidate",
    "blocks",
    "candidate",
    "estimate",
    "fastest_fitting",
    "uniform_candidates",
]

EVERY_BLOCK = "every block: checkpoint"


@dataclass
class Candidate:
    """One whole-model plan: which option each module takes, and what it costs."""

    label: str
    chosen: dict[str, Option]
    estimated_bytes: int
    estimated_seconds: float
    measured_seconds: float | None = None
    notes: list[str] = field(default_factory=list)
    reason: str = ""  # why the planner took it or not (ConsideredPlan.reason)

    def fits(self, budget: int) -> bool:
        return self.estimated_bytes <= budget

    @property
    def seconds(self) -> float:
        """The measured recompute seconds where measured, else the estimate."""
        return self.estimated_seconds if self.measured_seconds is None else self.measured_seconds


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
    return record.kind, tuple(profile.modules[child].kind for child in record.children)


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


def fastest_fitting(candidates: list[Candidate], budget: int) -> Candidate | None:
    """The fitting candidate with the least recompute seconds (the first among equals)."""
    fitting = [c for c in candidates if c.fits(budget)]
    return min(fitting, key=lambda c: c.seconds) if fitting else None
