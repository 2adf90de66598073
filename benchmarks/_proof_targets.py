"""The GPU proof's verdict on the benchmarks' targets, read from the JSON they wrote.

A benchmark exits 0 whatever its figures, so the proof reads each JSON file it collected
and lists every target (any mapping with ``met``, ``value`` and ``target``, nested under
``targets`` at any depth) as met, MISSED, or NOT PROVEN. A target the proof expects but
finds no figure for (the comparison with fairscale, when fairscale was missing or could
not run) is NOT PROVEN; both MISSED and NOT PROVEN fail the proof, unless the comparison
is declared expected to be absent (``--without-fairscale``).

bench_budget's JSON (``benchmark`` ``budget...``) has no ``targets``: its families'
``summary_at_half`` give three targets each, ``<family>.time`` (the measured step-time
ratio at budget 0.5 against the family's limit, the planner's estimate beside it),
``<family>.budget`` (activation memory within 0.5 + 2%) and ``<family>.exact`` (the
bench's rule: bit-equal on the CPU, within its tolerance elsewhere). A family the run
was asked for but wrote no figure for (skipped, cut short, no plan at 0.5) is NOT PROVEN.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Targets the proof expects from a benchmark's CUDA run, by benchmark name.
EXPECTED = {
    "offload": (
        "step_over_floor",
        "overlap_efficiency",
        "allocator_retries",
        "backward_allocations_on_device",
        "faster_than_fsdp2",
        "speedup_vs_fairscale",
    ),
}
#: Where a comparison's JSON says why it has no figure, by target.
REASONS = {"speedup_vs_fairscale": "fairscale", "faster_than_fsdp2": "fsdp2"}
FAIRSCALE_TARGET = "speedup_vs_fairscale"


@dataclass
class Verdict:
    """One target's outcome."""

    benchmark: str
    target: str
    verdict: str  # met, MISSED, NOT PROVEN, not expected
    detail: str

    @property
    def fails(self) -> bool:
        return self.verdict in ("MISSED", "NOT PROVEN")


def _leaves(targets: Any, prefix: str = "") -> list[tuple[str, dict[str, Any]]]:
    if not isinstance(targets, dict):
        return []
    if "met" in targets:
        return [(prefix, targets)]
    found = []
    for key, value in targets.items():
        found += _leaves(value, f"{prefix}.{key}" if prefix else str(key))
    return found


def _describe(target: dict[str, Any]) -> str:
    """The measured figure (``value``, else ``ratio``, else the other fields) and the target."""
    wanted = target.get("target")
    if "value" in target or "ratio" in target:
        value = target.get("value", target.get("ratio"))
        shown = f"value {value:.3f}" if isinstance(value, float) else f"value {value}"
    else:
        shown = ", ".join(
            f"{key} {figure}"
            for key, figure in target.items()
            if key not in ("met", "target", "note")
        )
    return f"{shown}, wanted {wanted}" + (f" ({target['note']})" if target.get("note") else "")


def _ratio(value: Any) -> str:
    return f"{value:.2f}x" if isinstance(value, (int, float)) else "-"


def budget_verdicts(name: str, document: dict[str, Any]) -> list[Verdict]:
    """bench_budget's targets at budget 0.5, per family (see the module docstring)."""
    found: list[Verdict] = []
    results = {str(result.get("model")): result for result in document.get("models", [])}
    requested = list(document.get("requested") or results)
    skipped = document.get("skipped", {})
    for family in [*requested, *(f for f in results if f not in requested)]:
        result = results.get(family)
        summary = None if result is None else result.get("summary_at_half")
        if summary is None:
            if family in skipped:
                reason = f"skipped: {skipped[family]}"
            elif result is None:
                reason = "no figure was written (the run stopped before this family)"
            else:
                reason = str(result.get("unavailable", {}).get("budget 0.5", "no plan at 0.5"))
            found.append(Verdict(name, f"{family}.budget 0.5", "NOT PROVEN", reason[:200]))
            continue
        size = f", {result.get('size')} size" if result.get("size") else ""
        estimate_error = summary.get("estimate_error")
        error = f"{estimate_error:.2f}" if isinstance(estimate_error, (int, float)) else "-"
        time_detail = (
            f"measured {_ratio(summary['measured'])}, estimate {_ratio(summary['estimate'])} "
            f"(|est - meas| {error}), wanted <= {summary['time_target']:.2f}x{size}"
        )
        memory_detail = f"memory {_ratio(summary['bytes_ratio'])}, wanted <= 0.52x"
        rule = result.get("exact_rule", "bit-equal")
        difference = summary.get("grad_difference")
        rerun = result.get("plain_rerun_difference")
        exact_detail = f"rule: {rule}" + (
            f"; largest gradient difference {difference:.1e}"
            if isinstance(difference, (int, float))
            else ""
        )
        if isinstance(rerun, (int, float)):
            exact_detail += f" (plain against itself {rerun:.1e})"
        for target, met, detail in (
            ("time", summary.get("time_met"), time_detail),
            ("budget", summary.get("fits"), memory_detail),
            ("exact", summary.get("exact"), exact_detail),
        ):
            verdict = {True: "met", False: "MISSED"}.get(met, "NOT PROVEN")
            found.append(Verdict(name, f"{family}.{target}", verdict, detail))
    return found


def verdicts(files: list[Path], *, without_fairscale: bool = False) -> list[Verdict]:
    """Every target in the JSON ``files``, with the expected ones that are absent."""
    found: list[Verdict] = []
    for path in files:
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            found.append(Verdict(path.name, "-", "NOT PROVEN", f"unreadable JSON: {exc}"))
            continue
        name = str(document.get("benchmark", path.stem))
        if name.startswith("budget"):
            # The name lists every family; the rows name theirs, so the size alone here.
            found += budget_verdicts(f"budget-{document.get('size', 'bench')}", document)
        leaves = _leaves(document.get("targets", {}))
        seen = set()
        for target_name, target in leaves:
            seen.add(target_name)
            met = target.get("met")
            verdict = {None: "NOT PROVEN", True: "met", "yes": "met"}.get(met, "MISSED")
            if target_name == FAIRSCALE_TARGET and verdict == "NOT PROVEN" and without_fairscale:
                verdict = "not expected"
            found.append(Verdict(name, target_name, verdict, _describe(target)))
        for expected in EXPECTED.get(name, ()):
            if expected in seen:
                continue
            if expected == FAIRSCALE_TARGET and without_fairscale:
                found.append(Verdict(name, expected, "not expected", "--without-fairscale"))
                continue
            record = document.get(REASONS.get(expected, ""), {})
            reason = record.get("result", "no figure was written")
            found.append(Verdict(name, expected, "NOT PROVEN", str(reason)))
    return found


def print_verdicts(found: list[Verdict]) -> None:
    """Print the targets table."""
    if not found:
        print("targets: none collected")
        return
    rows = [("benchmark", "target", "verdict", "detail")] + [
        (v.benchmark, v.target, v.verdict, v.detail) for v in found
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        cells = [row[i].ljust(widths[i]) for i in range(3)]
        print("  ".join([*cells, row[3]]))
