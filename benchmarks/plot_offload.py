"""Draw where an offloaded step's time goes, from bench_offload.py's (and the caps') JSON.

Left: forward plus backward of every variant measured, against the copy floor (every
parameter loaded twice at the measured host-to-device bandwidth) and the 1.15x target; a
peer with no figure in the JSON is named with its recorded result, never drawn. Right
(when ``--caps`` gives bench_offload_caps.py's JSON): one profiled step under the cap,
the GPU's time split into kernels alone, kernels and copies at once, copies alone and
idle; the copies by direction; and the host's time in the allocator's retries.

Usage: python benchmarks/plot_offload.py RESULT.json [--caps CAPS.json] [--out FILE.png]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FLOOR_TARGET = 1.15
#: The peers bench_offload.py times, by their name in its JSON, and their record's key.
PEERS = {
    "FSDP2 CPUOffloadPolicy": "fsdp2",
    "fairscale OffloadModel": "fairscale",
    "DeepSpeed ZeRO-3 offload": "deepspeed",
}


def floor_ms(result: dict[str, Any]) -> float:
    """The copy floor in ms: the JSON's own, else from its bandwidth and model bytes."""
    if "copy_floor" in result:
        return float(result["copy_floor"]["floor_s"]) * 1e3
    model_bytes = result["model"]["bytes"]
    bandwidth = result["bandwidth_bytes_per_s"]
    return float(max(2 * model_bytes / bandwidth["h2d"], model_bytes / bandwidth["d2h"])) * 1e3


def step_bars(
    result: dict[str, Any], caps: dict[str, Any] | None
) -> tuple[list[tuple[str, float]], list[str]]:
    """The forward-plus-backward bars (label, ms) and a line for each peer not measured."""
    medians = result["median_step_s"]
    budget = result.get("budget_bytes") or 0
    cap = f"{budget / 2**30:g} GiB" if budget else "no cap"
    bars: list[tuple[str, float]] = []
    if "in-device baseline (no budget)" in medians:
        bars.append(("in device, no cap", medians["in-device baseline (no budget)"] * 1e3))
    checkpointed = medians.get("in-device, checkpointed micro-batches (no budget)")
    if checkpointed is None and caps is not None:
        checkpointed = caps["in_device"]["checkpointed_microbatches_s"]
    if checkpointed is not None:
        bars.append(("in device, checkpointed\nmicro-batches, no cap", checkpointed * 1e3))
    bars.append((f"offload.OffloadModel\nunder {cap}", medians["offload.OffloadModel"] * 1e3))
    missing = []
    for name, key in PEERS.items():
        record = result.get(key, {})
        if name in medians:
            attempts = record.get("attempts", [])
            where = f"{attempts[-1]['cap_gib']:g} GiB" if attempts else cap
            bars.append((f"{name}\nunder {where}", medians[name] * 1e3))
        else:
            missing.append(f"{name}: {record.get('result', 'to be measured')}")
    return bars, missing


def draw(
    result: dict[str, Any], caps: dict[str, Any] | None, out: Path, device: str | None = None
) -> None:
    """Draw the figure into ``out``; ``device`` names the card where the JSON does not."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 2 if caps is not None else 1
    figure, axes = plt.subplots(1, panels, figsize=(7.2 * panels, 4.8), squeeze=False)
    left = axes[0][0]
    bars, missing = step_bars(result, caps)
    floor = floor_ms(result)
    labels = [label for label, _ in bars][::-1]
    values = [value for _, value in bars][::-1]
    left.barh(labels, values, color=["C1" if "offload." in n else "C7" for n in labels])
    for index, value in enumerate(values):
        left.text(value, index, f" {value:,.0f} ms", va="center", fontsize=8)
    left.axvline(floor, color="C3", linestyle="--", label=f"copy floor {floor:.0f} ms")
    left.axvline(
        FLOOR_TARGET * floor, color="C2", linestyle=":", label=f"target {FLOOR_TARGET}x floor"
    )
    left.set_xlim(0, max(values) * 1.25)
    left.set_xlabel("forward plus backward (ms, median)")
    left.set_title("forward plus backward against the copy floor", fontsize=10)
    left.legend(loc="upper right", fontsize=8)
    left.tick_params(axis="y", labelsize=8)
    if missing:
        left.text(
            0.99, 0.78, "not measured in this run:\n" + "\n".join(missing),
            transform=left.transAxes, ha="right", va="top", fontsize=7, wrap=True,
        )  # fmt: skip

    if caps is not None:
        right = axes[0][1]
        gpu = caps["profiled_gpu_ms"]
        both = gpu["kernels_and_copies_at_once_ms"]
        parts = [
            ("kernels alone", gpu["kernels_ms"] - both, "C0"),
            ("kernels and copies at once", both, "C4"),
            ("copies alone", gpu["copies_ms"] - both, "C1"),
            ("idle", gpu["idle_ms"], "C7"),
        ]
        host = caps.get("profiled_host_calls", {})
        rows = [
            ("GPU, one step", parts),
            (
                "copies by direction",
                [
                    ("host to device", gpu["host_to_device_ms"], "C1"),
                    ("device to host", gpu["device_to_host_ms"], "C5"),
                ],
            ),
            (
                "host, allocator retries",
                [
                    (f"host in {name}", host[name]["ms"], color)
                    for name, color in (("cudaFree", "C3"), ("cudaEventSynchronize", "C8"))
                    if name in host
                ],
            ),
        ]
        names = [name for name, _ in rows][::-1]
        for index, (_, pieces) in enumerate(rows[::-1]):
            start = 0.0
            for label, width, color in pieces:
                right.barh(index, width, left=start, color=color, label=label)
                if width > 60:
                    right.text(start + width / 2, index, f"{width:.0f}", ha="center",
                               va="center", fontsize=7)  # fmt: skip
                start += width
        right.set_yticks(range(len(names)), names, fontsize=8)
        right.axvline(floor, color="C3", linestyle="--", label="copy floor")
        right.set_xlabel("ms")
        right.set_title(
            f"one step profiled under {caps['profiled_cap_gib']:g} GiB "
            f"(span {gpu['span_ms']:.0f} ms)",
            fontsize=10,
        )
        right.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, fontsize=7)
    machine = result.get("machine", {})
    figure.suptitle(
        f"offload on {result.get('summary', {}).get('device') or device or result['backend']}, "
        f"torch {machine.get('torch', '?')}, {result['date'][:10]}: "
        f"{result['model']['blocks']} blocks of width {result['model']['width']}, "
        f"{result['model']['bytes'] / 1e9:.1f} GB of parameters",
        fontsize=10,
    )
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("result", type=Path, help="bench_offload.py's JSON (a device run)")
    parser.add_argument("--caps", type=Path, default=None, help="bench_offload_caps.py's JSON")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "images" / "offload-step.png")
    parser.add_argument("--device", default=None, help="the card's name, where the JSON lacks it")
    args = parser.parse_args(argv)
    result = json.loads(args.result.read_text())
    caps = json.loads(args.caps.read_text()) if args.caps else None
    draw(result, caps, args.out, args.device)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
