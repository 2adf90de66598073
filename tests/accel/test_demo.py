from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from accel import _demo
from accel._demo import DemoConfig, RunResult, config_from, gradient_agreement

TINY = ["--steps", "3", "--layers", "2", "--width", "32", "--heads", "2", "--sequence", "16"]


def test_demo_trains_three_ways_and_gradients_match(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="--plot needs the 'demo' extra (matplotlib)")
    plot = tmp_path / "demo.png"
    result = subprocess.run(
        [sys.executable, "-m", "accel", "demo", *TINY, "--batch", "4", "--plot", str(plot)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    assert rows["plain"].endswith("reference")
    assert rows["checkpoint"].endswith("yes (bit-exact)")
    assert rows["offload"].endswith("yes (bit-exact)")
    assert "step time" in result.stdout and "peak RSS" in result.stdout
    for variant in ("plain", "checkpoint", "offload"):
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
