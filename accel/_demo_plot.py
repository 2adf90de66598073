"""The demo's picture: memory per layer, loss curves, and each run's time and memory."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from ._demo_config import RunResult

__all__ = ["draw"]


def draw(results: Sequence[RunResult], path: str) -> None:
    """Draw the runs to the PNG file ``path`` (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError as exc:
        raise SystemExit(
            "accel demo: --plot needs matplotlib, which is not installed; run "
            "`python -m pip install 'accel-hal[demo]'` or drop --plot."
        ) from exc
    figure, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    (memory_axis, loss_axis), (time_axis, peak_axis) = axes
    names = [result.variant for result in results]
    colours = [f"C{index}" for index in range(len(results))]
    for result, marker, colour in zip(results, "osd^v", colours, strict=False):
        layers = range(len(result.layer_memory))
        memory_axis.plot(
            layers,
            [m / 2**20 for m in result.layer_memory],
            marker=marker,
            color=colour,
            label=result.variant,
        )
        loss_axis.plot(
            range(1, len(result.losses) + 1),
            result.losses,
            marker=marker,
            markersize=3,
            color=colour,
            label=result.variant,
        )
    memory_axis.set(
        title=f"Activation memory in the first forward\n({results[0].memory_kind})",
        xlabel="after layer (0 = embedding, last = head)",
        ylabel="MiB",
    )
    loss_axis.set(title="Training loss (identical curves: same math)", xlabel="step", ylabel="loss")
    for axis in (memory_axis, loss_axis):
        axis.grid(alpha=0.3)
        axis.legend()

    plain_time = statistics.median(results[0].step_seconds)
    times = [statistics.median(result.step_seconds) * 1e3 for result in results]
    bars = time_axis.barh(names, times, color=colours)
    time_axis.bar_label(
        bars, labels=[f"{t:.1f} ms ({t / plain_time / 1e3:.2f}x)" for t in times], padding=3
    )
    time_axis.set(title="Step time (median)", xlabel="ms")
    # Room for the bar labels inside the panel, and few enough ticks to stay legible.
    time_axis.set_xlim(0, max(times) * 1.6)
    time_axis.xaxis.set_major_locator(MaxNLocator(5))

    positions = range(len(results))
    activations = [result.activation_bytes / 2**20 for result in results]
    rss = [result.peak_rss_bytes / 2**20 for result in results]
    height = 0.38
    act_bars = peak_axis.barh(
        [p - height / 2 for p in positions], activations, height, color=colours, label="activations"
    )
    rss_bars = peak_axis.barh(
        [p + height / 2 for p in positions],
        rss,
        height,
        color=colours,
        alpha=0.45,
        hatch="//",
        label="peak RSS",
    )
    peak_axis.bar_label(act_bars, labels=[f"{a:.1f}" for a in activations], padding=3)
    peak_axis.bar_label(rss_bars, labels=[f"{r:.0f}" for r in rss], padding=3)
    peak_axis.set_yticks(list(positions), names)
    peak_axis.set(title="Memory per run\n(solid: activations; hatched: peak RSS)", xlabel="MiB")
    peak_axis.set_xlim(0, max(rss + activations) * 1.2)
    for axis in (time_axis, peak_axis):
        axis.invert_yaxis()
        axis.grid(alpha=0.3, axis="x")
    figure.suptitle(f"accel demo on {results[0].backend}")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
