"""bench_budget's judgements on measured rows: the noise of a run and dominance by fixed rules.

Pure arithmetic on figures already measured (no model, no clock), so that it is tested
on synthetic rows (``tests/test_bench_budget.py``).

*Noise.* One run times, in the same rounds, the plain model twice (``plain`` and
``plain again``, two copies) and one plan twice (``budget 0.5`` and ``budget 0.5
again``: the same plan applied to two copies). Both pairs ought to measure alike: the
plain pair's ratio differs from 1, and the plan pair's two ratios from each other, by
the noise of the machine. :func:`noise` gives both; the bench takes more rounds until
both are within :data:`AGREEMENT` (or it reaches its most rounds), and reports the
larger beside every time figure. A time difference under it is not a finding.

*Dominance.* A fixed rule (torch's "save matmuls" policy, torchtitan's operator rule)
dominates a plan of the planner when it keeps no more activation memory and its step
is faster by more than :data:`DOMINANCE_MARGIN`. For each rule, the bench plans at the
rule's own measured memory (``plan at <rule>'s memory``) and times that plan in the same
rounds; :func:`dominance` compares each rule with that plan and with every other plan
of the run (the budget rows), and a family is dominated where any rule dominates any
plan. The issue's target is 0 dominated families.

*Budget order.* A looser budget's plan should never measure slower than a tighter one's
by more than :data:`AGREEMENT`: :func:`budget_order` compares every pair of ``budget
<fraction>`` rows. Where both budgets gave the same plan (the same ``plan_digest``), the
two rows time one step twice, so their difference is the run's noise and no finding.

*Targets.* At budget 0.5: memory at most :data:`TARGET_BYTES` of plain's (+2%), the step
at most :data:`TARGET_TIME` of plain's (:data:`TARGET_TRANSFORMER` on the
transformer-shaped families), exact; :func:`summary_at_half` gives the 0.5 row's verdict.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from _report import print_table

__all__ = [
    "AGAIN",
    "AGREEMENT",
    "DOMINANCE_MARGIN",
    "RULES",
    "TARGET_BYTES",
    "TARGET_TIME",
    "TARGET_TRANSFORMER",
    "WITHIN",
    "at_memory",
    "budget_order",
    "count_dominated",
    "count_looser_slower",
    "dominance",
    "is_plan",
    "median_interval",
    "noise",
    "print_dominance",
    "summary_at_half",
]

#: Two timings of the same thing agree when their ratios to plain differ by at most this.
AGREEMENT = 0.03
#: A rule dominates a plan when faster by more than this (step time over plain's).
DOMINANCE_MARGIN = 0.03
#: The fixed rules people write by hand, as bench_budget names its variants.
RULES = ("torch selective", "torchtitan op rule")
#: At budget 0.5: activation memory over plain's, step time over plain's (any family, and
#: the transformer-shaped ones).
TARGET_BYTES, TARGET_TIME, TARGET_TRANSFORMER = 0.5, 1.20, 1.15
#: The suffix of a variant timed a second time, for the noise.
AGAIN = " again"
#: The half-width a row's 95% interval needs before the bench stops taking rounds.
WITHIN = 0.04
#: The normal quantile of a two-sided 95% interval.
_Z95 = 1.959964
#: So that ratios exactly ``margin`` apart (1.09 - 1.06 in floats) do not count as more.
_ROUNDING = 1e-9


def at_memory(rule: str) -> str:
    """The variant that plans at ``rule``'s measured memory."""
    return f"plan at {rule}'s memory"


def is_plan(name: str) -> bool:
    """Whether variant ``name`` is a plan of the planner (not a repeat for the noise)."""
    planned = name.startswith("budget") or name.startswith("plan at ")
    return planned and not name.endswith(AGAIN)


def _ratio(times: Sequence[float], reference: Sequence[float]) -> float:
    return statistics.median(a / b for a, b in zip(times, reference, strict=True))


def median_interval(ratios: Sequence[float]) -> tuple[float, float]:
    """A distribution-free 95% interval for the median of ``ratios``.

    Independent rounds put the median between the order statistics of (1-based) ranks
    ``floor((n - 1.96 sqrt(n)) / 2)`` and ``ceil(1 + (n + 1.96 sqrt(n)) / 2)`` with a
    chance of about 95%, whatever the distribution of a round's ratio (the binomial
    count of rounds under the median). Ranks outside ``1..n`` are clamped: with fewer
    than about ten rounds the interval is the whole range, and wider than 95%.

    Args:
        ratios: One ratio per round; at least one.

    Returns:
        The interval's low and high ends.
    """
    if not ratios:
        raise ValueError("median_interval needs at least one ratio; got none.")
    ordered = sorted(ratios)
    n = len(ordered)
    spread = _Z95 * math.sqrt(n)
    low = max(1, math.floor((n - spread) / 2))
    high = min(n, math.ceil(1 + (n + spread) / 2))
    return ordered[low - 1], ordered[high - 1]


def noise(
    times: Mapping[str, Sequence[float]], repeated: str | None, within: float = WITHIN
) -> dict[str, Any]:
    """The run's noise from the variants timed twice, and each row's interval.

    Args:
        times: Seconds per round by variant; ``plain`` and ``plain again`` are needed,
            ``repeated`` and ``repeated + AGAIN`` where ``repeated`` is given.
        repeated: The plan timed twice (``"budget 0.5"``), or ``None`` where it has no
            plan (then only the plain pair counts).
        within: The half-width every row's interval needs (:data:`WITHIN`).

    Returns:
        ``plain_vs_plain`` (|plain again / plain - 1|, medians of per-round ratios),
        ``plan_vs_plan`` (the difference of the two copies' ratios to plain, or
        ``None``), ``noise`` (the larger), ``intervals`` (each variant's
        :func:`median_interval` of its ratios to plain), ``widest`` (the largest
        half-width, and its variant), ``rounds`` and ``agreed``: both pairs within
        :data:`AGREEMENT` and every half-width within ``within``.
    """
    plain = times["plain"]
    plain_pair = abs(_ratio(times["plain" + AGAIN], plain) - 1.0)
    plan_pair = None
    if repeated is not None and repeated in times and repeated + AGAIN in times:
        plan_pair = abs(_ratio(times[repeated], plain) - _ratio(times[repeated + AGAIN], plain))
    largest = max(plain_pair, plan_pair or 0.0)
    intervals = {
        name: median_interval([a / b for a, b in zip(series, plain, strict=True)])
        for name, series in times.items()
        if name != "plain"
    }
    widest = max(intervals, key=lambda name: intervals[name][1] - intervals[name][0])
    half_width = (intervals[widest][1] - intervals[widest][0]) / 2
    return {
        "plain_vs_plain": plain_pair,
        "plan_vs_plan": plan_pair,
        "plan_repeated": repeated if plan_pair is not None else None,
        "noise": largest,
        "intervals": {name: list(ends) for name, ends in intervals.items()},
        "widest": {"variant": widest, "half_width": half_width, "within": within},
        "rounds": len(plain),
        "agreed": largest <= AGREEMENT and half_width <= within + _ROUNDING,
        "within": AGREEMENT,
    }


def dominance(
    rows: Mapping[str, Mapping[str, Any]], margin: float = DOMINANCE_MARGIN
) -> dict[str, Any]:
    """Whether a fixed rule keeps no more memory than a plan and runs faster by ``margin``.

    Args:
        rows: Measured rows by variant name, each with ``bytes_ratio`` and
            ``time_ratio`` (to plain); the rules are :data:`RULES`, the plans every
            :func:`is_plan` name.
        margin: How much faster (step-time ratio) a rule must be to dominate.

    Returns:
        ``rules``: per rule present, its figures, those of the plan at its memory (or
        ``None`` where that plan is missing) and ``beats``, the plans it dominates, with
        by how much; ``dominated``: whether any rule dominates any plan; ``margin``.
    """
    plans = {name: row for name, row in rows.items() if is_plan(name)}
    found: dict[str, Any] = {}
    for rule in RULES:
        if rule not in rows:
            continue
        mine = rows[rule]
        beats = [
            {
                "plan": name,
                "bytes_ratio": plan["bytes_ratio"],
                "time_ratio": plan["time_ratio"],
                "faster_by": plan["time_ratio"] - mine["time_ratio"],
            }
            for name, plan in plans.items()
            if mine["bytes_ratio"] <= plan["bytes_ratio"]
            and plan["time_ratio"] - mine["time_ratio"] > margin + _ROUNDING
        ]
        at = rows.get(at_memory(rule))
        found[rule] = {
            "bytes_ratio": mine["bytes_ratio"],
            "time_ratio": mine["time_ratio"],
            "plan_at_its_memory": None
            if at is None
            else {"bytes_ratio": at["bytes_ratio"], "time_ratio": at["time_ratio"]},
            "beats": beats,
            "dominates": bool(beats),
        }
    return {
        "rules": found,
        "dominated": any(rule["dominates"] for rule in found.values()),
        "margin": margin,
    }


def _budget(name: str) -> float | None:
    """The fraction of a ``budget <fraction>`` row (not a repeat), else ``None``."""
    head, _, fraction = name.partition(" ")
    if head != "budget" or name.endswith(AGAIN):
        return None
    try:
        return float(fraction)
    except ValueError:
        return None


def budget_order(
    rows: Mapping[str, Mapping[str, Any]], margin: float = AGREEMENT
) -> dict[str, Any]:
    """Whether a looser budget's plan measures slower than a tighter one's.

    Args:
        rows: Measured rows by variant name; the ``budget <fraction>`` ones are judged,
            each with ``time_ratio`` and, where planned, ``plan_digest``.
        margin: How much slower (step-time ratio) counts.

    Returns:
        ``slower``: each pair where the looser budget is slower by more than ``margin``
        (``looser``, ``tighter``, both times, ``slower_by``, ``same_plan``);
        ``looser_slower``: whether any such pair has two different plans; ``margin``.
    """
    budgets = sorted((fraction, name) for name in rows if (fraction := _budget(name)) is not None)
    slower = []
    for i, (_, tighter) in enumerate(budgets):
        for _, looser in budgets[i + 1 :]:
            by = rows[looser]["time_ratio"] - rows[tighter]["time_ratio"]
            if by <= margin + _ROUNDING:
                continue
            digest = rows[looser].get("plan_digest")
            slower.append(
                {
                    "looser": looser,
                    "tighter": tighter,
                    "looser_time_ratio": rows[looser]["time_ratio"],
                    "tighter_time_ratio": rows[tighter]["time_ratio"],
                    "slower_by": by,
                    "same_plan": digest is not None and digest == rows[tighter].get("plan_digest"),
                }
            )
    return {
        "slower": slower,
        "looser_slower": any(not pair["same_plan"] for pair in slower),
        "margin": margin,
    }


def count_looser_slower(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Over a run's families: where a looser budget's plan is slower (target: none)."""
    judged = [r for r in results if r.get("budget_order")]
    names = [r["model"] for r in judged if r["budget_order"]["looser_slower"]]
    noise_only = [
        r["model"]
        for r in judged
        if r["budget_order"]["slower"] and not r["budget_order"]["looser_slower"]
    ]
    return {
        "looser_slower": len(names),
        "families": len(judged),
        "names": names,
        "same_plan_only": noise_only,
        "target": 0,
    }


def summary_at_half(
    half: dict[str, Any] | None,
    limit: float,
    full_ratio: float | None,
    run_noise: dict[str, Any],
) -> dict[str, Any] | None:
    """The budget-0.5 row's summary: memory, measured and estimated time, the targets.

    ``None`` where the planner gave no plan at 0.5. ``met`` is the time target (``limit``),
    the budget plus 2% and exactness together; ``not_slower_than_full`` is reported apart
    (``None`` where ``full`` was not timed: ``--rows targets``); ``noise`` is the run's
    (:func:`noise`), ``interval`` the row's.
    """
    if half is None:
        return None
    time_met = half["measured"] <= limit
    fits = half["bytes_ratio"] <= TARGET_BYTES + 0.02
    exact = bool(half["exact"])
    return {
        "bytes_ratio": half["bytes_ratio"],
        "measured": half["measured"],
        "estimate": half["estimate"],
        "estimate_error": half["estimate_error"],
        "noise": run_noise["noise"],
        "interval": half.get("interval"),
        "time_target": limit,
        "time_met": time_met,
        "fits": fits,
        "exact": exact,
        "bit_equal": half.get("bit_equal"),
        "grad_difference": half.get("grad_difference"),
        "not_slower_than_full": None if full_ratio is None else half["measured"] <= full_ratio,
        "met": time_met and fits and exact,
    }


def count_dominated(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Over a run's families: how many a fixed rule dominates, and which (target: 0)."""
    judged = [r for r in results if r.get("dominance") and r["dominance"]["rules"]]
    names = [r["model"] for r in judged if r["dominance"]["dominated"]]
    return {"dominated": len(names), "families": len(judged), "names": names, "target": 0}


def _figures(row: Mapping[str, Any] | None) -> str:
    if row is None:
        return "-"
    return f"{row['bytes_ratio']:.2f}x, {row['time_ratio']:.2f}x"


def print_dominance(results: Sequence[Mapping[str, Any]]) -> None:
    """One row per family and rule: the rule, the plan at its memory, what it dominates."""
    rows = []
    for result in results:
        judged = result.get("dominance")
        if not judged:
            continue
        for rule, found in judged["rules"].items():
            beaten = ", ".join(
                f"{b['plan']} ({b['bytes_ratio']:.2f}x, {b['time_ratio']:.2f}x)"
                for b in found["beats"]
            )
            rows.append(
                (
                    result["model"],
                    rule,
                    _figures(found),
                    _figures(found["plan_at_its_memory"]),
                    f"{result['noise']['noise']:.2f}" if result.get("noise") else "-",
                    beaten or "none",
                )
            )
    if not rows:
        return
    print(
        f"\nfixed rules against the planner (memory, time; a rule dominates a plan when it "
        f"keeps no more memory and is faster by more than {DOMINANCE_MARGIN})"
    )
    headers = ("model", "rule", "rule", "plan at its memory", "noise", "plans it dominates")
    print_table(headers, rows)
    count = count_dominated(results)
    names = f" ({', '.join(count['names'])})" if count["names"] else ""
    print(f"dominated families: {count['dominated']} of {count['families']}{names}; target 0")
