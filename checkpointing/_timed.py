"""Timings taken in place, and the rules that turn them into decisions that hold.

On a shared host a step's time can double from one round to the next (the issue's
Whisper: 70.7 to 181.6 ms for the same plan). Every plan timed here is therefore timed
in interleaved rounds (:func:`._overhead.measured_steps`) and compared round by round,
so that a busy spell slows both sides of a comparison; and a measurement overrides the
cost model only where every round agrees by a margin. Where the rounds disagree, the
measurement cannot separate the plans, and the estimate (the profile's operator
timings, medians over repeated blocks, :mod:`._profile`)
decides: a rule that does not flip with the host's load.

Nothing here runs the plain step. Its time, which the recompute estimates are set
against, comes from a *reference* plan: every repeated block checkpointed whole (or,
in a model without repeated blocks, every innermost candidate), whose step is the
plain step plus one more forward of those modules, a forward the profile timed.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from ._candidates import blocks
from ._decisions import FULL
from ._options import Option
from ._profile import StepProfile

__all__ = [
    "MARGIN",
    "TIE",
    "Rounds",
    "plain_step_time",
    "reference",
    "separated",
    "shortfall",
    "steady",
]

MARGIN = 0.05  # a measured plan must be this much faster in every round to overrule
TIE = 3.0  # noise widths an option must beat checkpointing its module whole by


def steady(
    profile: StepProfile, options: dict[str, list[Option]]
) -> tuple[dict[str, list[Option]], int]:
    """Set aside the options the timing cannot tell from checkpointing their module whole.

    An option that saves no more bytes than checkpointing the module whole, and whose
    estimated recompute is not faster than the whole module's by :data:`TIE` times the
    noise of the module's summed operator times, is dropped: the whole module saves at
    least as much and, as far as the timing can tell, costs as much, and it is the same
    choice in every planning. The module's noise is the profile's per-call noise scaled
    by ``sqrt(sum(t**2)) / sum(t)`` over its calls (independent noise on many calls
    partly cancels). Without a measured noise (a lazy backend) nothing is dropped.

    Returns:
        The options left, and how many were set aside.
    """
    if profile.noise <= 0:
        return options, 0
    kept: dict[str, list[Option]] = {}
    for name, found in options.items():
        times = [call.seconds for call in profile.modules[name].ops if call.seconds > 0]
        total = sum(times)
        full = next(o for o in found if o.decision == FULL)
        spread = profile.noise * math.sqrt(sum(t * t for t in times)) / total if total else 0.0
        kept[name] = [
            o
            for o in found
            if o is full
            or o.saved_bytes > full.saved_bytes
            or o.seconds < full.seconds * (1 - TIE * spread)
        ]
    return kept, sum(len(found) - len(kept[name]) for name, found in options.items())


def reference(profile: StepProfile, options: dict[str, list[Option]]) -> dict[str, Option]:
    """The reference plan: repeated blocks (else innermost candidates) checkpointed whole.

    Its step needs the least memory a simple plan needs (the blocks' inputs, and one
    block's activations while it is recomputed), so timing it stays within what the
    chosen plan needs.
    """
    names = blocks(profile, options)
    if not names:
        names = [n for n in options if not any(_inside(o, n) for o in options)]
    order = list(profile.modules)
    return {
        name: next(o for o in options[name] if o.decision == FULL)
        for name in sorted(names, key=order.index)
    }


def _inside(name: str, container: str) -> bool:
    """Whether module ``name`` lies inside ``container`` (the root holds every other)."""
    return name != container and (not container or name.startswith(f"{container}."))


@dataclass(frozen=True)
class Rounds:
    """Step times of one plan, one per interleaved round, and its estimated recompute."""

    seconds: tuple[float, ...]
    recompute: float

    @property
    def fastest(self) -> float:
        return min(self.seconds)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def plain_step_time(profile: StepProfile, timed: Rounds) -> float:
    """The plain step's seconds: the reference's fastest step less its recomputation.

    Never less than the profiled forward, and three forwards where nothing was timed.
    """
    if not timed.seconds:
        return 3 * profile.forward_time
    return max(timed.fastest - timed.recompute, profile.forward_time)


def shortfall(plan: Rounds, against: Rounds) -> float:
    """Seconds ``plan`` was slower than estimated: the median over the rounds, or zero.

    Per round, ``plan``'s step less ``against``'s, less the estimated difference of
    their recomputations. Zero unless every round shows ``plan`` slower than estimated
    (then the median of the rounds): a single slow round never changes the plan.
    """
    expected = plan.recompute - against.recompute
    gaps = [a - b - expected for a, b in zip(plan.seconds, against.seconds, strict=True)]
    return statistics.median(gaps) if gaps and min(gaps) > 0 else 0.0


def separated(faster: Rounds, slower: Rounds, margin: float = MARGIN) -> tuple[bool, str]:
    """Whether ``faster`` beat ``slower`` by ``margin`` in every round, and in words.

    Returns:
        ``(decided, why)``; ``why`` gives the per-round ratios' range.
    """
    ratios = [a / b for a, b in zip(faster.seconds, slower.seconds, strict=True) if b > 0]
    if not ratios:
        return False, "not timed"
    low, high = min(ratios), max(ratios)
    wins = sum(ratio < 1 - margin for ratio in ratios)
    why = (
        f"step ratio {low:.2f} to {high:.2f} over {len(ratios)} interleaved rounds, "
        f"{wins} of them faster by {margin:.0%} or more"
    )
    return wins == len(ratios), why
