from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from accel import _demo
from accel._demo import DemoConfig, RunResult, config_from, gradient_agreement
from accel._demo_config import VARIANTS
from accel._demo_train import quiet_child

TINY = ["--steps", "3", "--layers", "2", "--width", "32", "--heads", "2", "--sequence", "16"]


@pytest.mark.slow
def test_demo_trains_four_ways_and_gradients_match(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="--plot needs the 'demo' extra (matplotlib)")
    plot = tmp_path / "demo.png"
    result = subprocess.run(
        [sys.executable, "-m", "accel", "demo", *TINY, "--batch", "4", "--plot", str(plot)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    rows = {
        variant: [line for line in result.stdout.splitlines() if line.startswith(f"{variant}  ")]
        for variant in VARIANTS
    }
    assert all(len(found) == 1 for found in rows.values()), result.stdout
    assert rows["plain"][0].endswith("reference")
    for variant in ("checkpoint", "offload", "checkpoint (budget 0.5)"):
        assert rows[variant][0].endswith("yes (bit-exact)"), result.stdout
    assert "step time" in result.stdout and "peak RSS" in result.stdout
    for variant in VARIANTS:
        assert f"{variant:<10} [" in result.stderr and "3/3" in result.stderr
    assert plot.read_bytes().startswith(b"\x89PNG")


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    _demo.add_arguments(parser)
    return parser.parse_args(argv)


def test_defaults() -> None:
    assert config_from(_parse()) == DemoConfig()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--steps", "0"), "--steps must be at least 1, got 0"),
        (("--width", "30", "--heads", "4"), "--width 30 is not divisible by --heads 4"),
    ],
)
def test_bad_sizes_are_explained(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        config_from(_parse(*argv))


def _result(gradients: list[object]) -> RunResult:
    return RunResult("x", "cpu", [0.1], [1.0], [0], 0, "k", 0, gradients)


def test_gradient_agreement_reports_differences() -> None:
    import torch

    reference = _result([torch.zeros(3)])
    assert gradient_agreement(_result([torch.zeros(3)]), reference) == "yes (bit-exact)"
    assert gradient_agreement(_result([torch.full((3,), 1e-7)]), reference) == "within 1.0e-07"
    assert gradient_agreement(_result([torch.ones(3)]), reference).startswith("NO (max diff")


def test_budget_run_halves_activations_at_least() -> None:
    from accel._demo_train import train

    config = DemoConfig(steps=1, layers=2, width=32, heads=2, sequence=16, batch=4)
    plain, budget = train("plain", config), train(VARIANTS[-1], config)
    assert VARIANTS[-1] == "checkpoint (budget 0.5)"
    logits = config.batch * config.sequence * 256 * 4  # alive in both, saved by neither
    assert budget.activation_bytes - logits <= 0.5 * (plain.activation_bytes - logits)
    assert gradient_agreement(budget, plain) == "yes (bit-exact)"


def test_children_silence_only_the_numpy_warning() -> None:
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_child()
        warnings.warn("Failed to initialize NumPy: _ARRAY_API not found", UserWarning, stacklevel=1)
        warnings.warn("something else", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["something else"]
