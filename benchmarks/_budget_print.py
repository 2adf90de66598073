"""bench_budget's output: a table per family, the summary tables at the end, the plot.

* :func:`print_case`: one family's variants (activation bytes, memory and step-time
  ratios to plain, the plan's estimate, exactness), its noise, the targets at budget 0.5
  and, with ``--compile``, the compiled plan's verdict;
* :func:`print_summary`: one row per family at budget 0.5, then the compiled plans;
* :func:`draw` (``--plot``): one panel per family, memory against time.
"""

from __future__ import annotations

from typing import Any

from _budget_checks import TARGET_BYTES, is_plan
from _compiled_plan import MARGIN, VERDICTS
from _report import print_table

__all__ = ["draw", "print_case", "print_summary"]


def _brief(reason: str) -> str:
    """A short form of why a variant is unavailable, for the tables."""
    start = reason.find("the smallest reachable")
    if start >= 0:
        return "no plan: " + reason[start:].split(" (")[0]
    return reason[:60]


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _interval(ends: list[float] | None) -> str:
    """A row's 95% interval, as ``[1.14, 1.22]``; nothing for a file written before it."""
    return "" if ends is None else f"[{ends[0]:.2f}, {ends[1]:.2f}]"


def print_case(result: dict[str, Any]) -> None:
    print(f"\n{result['model']}: activation memory against step time (ratios to plain)")
    rows = []
    for name, row in result["variants"].items():
        exact = "-" if row["exact"] is None else ("yes" if row["exact"] else "NO")
        if row["exact"] and row.get("bit_equal") is False:
            exact = f"within {row['grad_difference']:.1e}"
        if row["grad_difference_to_compiled"] is not None:
            exact = f"diff {row['grad_difference_to_compiled']:.1e}"
        error = row["estimate_error"]
        rows.append(
            (
                name,
                f"{row['activation_bytes'] / 2**20:.1f} MiB",
                f"{row['bytes_ratio']:.2f}x",
                f"{row['step_seconds'] * 1e3:.1f} ms",
                f"{row['measured']:.2f}x {_interval(row.get('interval'))}",
                _ratio(row["estimate"]),
                "-" if error is None else f"{error:.2f}",
                exact,
            )
        )
    for name, reason in result["unavailable"].items():
        rows.append((name, "unavailable", "-", "-", "-", "-", "-", _brief(reason)))
    headers = ("variant", "activations", "memory", "step", "measured", "estimate")
    print_table((*headers, "|est - meas|", "exact"), rows)
    verdict = "met" if result["target_at_half"] else "NOT met"
    found = result["noise"]
    pair = "-" if found["plan_vs_plan"] is None else f"{found['plan_vs_plan']:.3f}"
    print(
        f"noise over {found['rounds']} rounds: plain against plain "
        f"{found['plain_vs_plain']:.3f}, plan against plan {pair}; widest 95% interval "
        f"+-{found['widest']['half_width']:.3f} ({found['widest']['variant']}); agreed "
        f"(pairs within {found['within']}, intervals within +-{found['widest']['within']}): "
        f"{'yes' if found['agreed'] else 'NO'}"
    )
    print(
        f"target at budget 0.5 (<= {TARGET_BYTES}x memory, <= {result['time_target']}x time, "
        f"<= full): {verdict}; every budget fits: "
        f"{'n/a (a budget has no plan)' if result['fits'] is None else result['fits']}; "
        f"exact: {result['exact']}"
    )
    for key, _, budget in VERDICTS:
        compiled = result.get(key)
        if compiled is None:
            continue
        within = "within" if compiled["within_estimate"] else "OVER"
        print(
            f"compiled plan {budget}: {compiled['bytes_ratio']:.3f}x memory against its "
            f"estimate {compiled['estimate']:.3f}x + {MARGIN} ({within}), "
            f"graph breaks added {compiled['graph_breaks_added']}, exact "
            f"{'bit-equal' if compiled['bit_equal'] else compiled['grad_difference']}: "
            f"{'met' if compiled['met'] else 'NOT met'}"
        )


def print_summary(results: list[dict[str, Any]]) -> None:
    """One row per family at budget 0.5: memory, measured, estimate, the targets."""
    print("\nsummary at budget 0.5 (ratios to plain)")
    rows = []
    for result in results:
        summary = result["summary_at_half"]
        if summary is None:
            reason = result["unavailable"].get("budget 0.5", "no plan")
            rows.append((result["model"], *("-",) * 8, _brief(reason)))
            continue
        time_verdict = "met" if summary["time_met"] else "missed"
        rows.append(
            (
                result["model"],
                f"{summary['bytes_ratio']:.2f}x",
                f"{summary['measured']:.2f}x {_interval(summary.get('interval'))}",
                _ratio(summary["estimate"]),
                f"{summary['estimate_error']:.2f}",
                f"{summary['noise']:.2f}",
                f"<= {summary['time_target']:.2f}x: {time_verdict}",
                "yes" if summary["fits"] else "NO",
                "yes" if summary["exact"] else "NO",
                "met" if summary["met"] else "missed",
            )
        )
    headers = ("model", "memory", "measured", "estimate", "|est - meas|", "noise")
    print_table((*headers, "time target", "within budget +2%", "exact", "target"), rows)
    for key, _, budget in VERDICTS:
        judged = [(r["model"], r[key]) for r in results if r.get(key)]
        if not judged:
            continue
        print(f"\ncompiled plan {budget} (inductor) against the compiled plain model")
        print_table(
            ("model", "memory", "estimate + 2%", "breaks added", "exact", "target"),
            [
                (
                    model,
                    f"{c['bytes_ratio']:.3f}x",
                    f"{c['limit']:.3f}x: {'within' if c['within_estimate'] else 'OVER'}",
                    c["graph_breaks_added"],
                    "bit-equal" if c["bit_equal"] else f"{c['grad_difference']:.1e}",
                    "met" if c["met"] else "missed",
                )
                for model, c in judged
            ],
        )


def draw(results: list[dict[str, Any]], path: str, backend: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(3, len(results))
    lines = -(-len(results) // columns)
    figure, axes = plt.subplots(lines, columns, figsize=(6 * columns, 4.6 * lines), squeeze=False)
    for axis in axes.flat[len(results) :]:
        axis.set_visible(False)
    for axis, result in zip(axes.flat, results, strict=False):
        rows = result["variants"]
        ours = sorted(
            (r["bytes_ratio"], r["time_ratio"])
            for v, r in rows.items()
            if (is_plan(v) and v.startswith("budget")) or v in ("plain", "full")
        )
        axis.plot(*zip(*ours, strict=True), color="C0", alpha=0.4)
        for name, row in rows.items():
            colour = "C1" if name.startswith("torch") else "C2" if name.startswith("comp") else "C0"
            marker = "s" if name.startswith("torch") else "^" if name.startswith("comp") else "o"
            axis.scatter(row["bytes_ratio"], row["time_ratio"], color=colour, marker=marker)
            axis.annotate(
                name,
                (row["bytes_ratio"], row["time_ratio"]),
                textcoords="offset points",
                xytext=(5, 4),
                fontsize=7,
            )
        axis.axvline(TARGET_BYTES, color="grey", linestyle=":", linewidth=1)
        axis.axhline(result["time_target"], color="grey", linestyle=":", linewidth=1)
        axis.set(
            title=f"{result['model']} (blue: accel, orange: torch, green: compiled)",
            xlabel="activation memory / plain",
            ylabel="step time / plain",
        )
        axis.grid(alpha=0.3)
    figure.suptitle(f"Checkpointing to a memory budget on {backend} (lower left is better)")
    # Room for the title above the first row (tight_layout alone lets it overlap).
    figure.tight_layout(rect=(0, 0, 1, 1 - 0.5 / figure.get_figheight()))
    figure.savefig(path, dpi=100)
    plt.close(figure)
