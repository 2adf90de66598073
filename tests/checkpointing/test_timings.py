"""Operator timings over three forwards: medians, the noise, and where no median is taken."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from _simulated_host import simulated  # loaded by tests/conftest.py
from torch import nn

import accel
from checkpointing._profile import profile_step
from checkpointing._timings import REPEATS, noise_of, repeated


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Dropout(0.1))
        self.second = nn.Sequential(nn.Linear(32, 16), nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x))


def _inputs() -> tuple[torch.Tensor]:
    return (torch.randn(8, 16, generator=torch.Generator().manual_seed(0)),)


def test_noise_is_the_spread_of_a_median_of_the_samples() -> None:
    spread = 0.2
    calls = [1e-3 * (n + 1) for n in range(20)]
    samples = [[t * math.exp(shift) for t in calls] for shift in (0.0, spread, -spread)]
    # Each call's log-samples have variance spread**2; a median of three varies
    # sqrt(pi / 2) times as much as their mean.
    sigma = spread / math.sqrt(math.log(2))
    assert noise_of(samples) == pytest.approx(math.sqrt(math.pi / 2) * sigma / math.sqrt(3))
    assert noise_of([calls, calls, calls]) == 0.0
    assert noise_of([calls]) == 0.0


def test_profile_gives_each_operator_the_median_of_three_forwards(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: dict[str, Any] = {}

    def fake(model: Any, inputs: Any, backend: Any, names: Any, first: Any, sync: Any) -> Any:
        seen["names"] = list(names)
        return [2e-3] * len(first), 0.125

    monkeypatch.setattr("checkpointing._profile.repeated", fake)
    profile = profile_step(_Net(), _inputs(), accel.get_backend("cpu"))
    assert profile.noise == 0.125
    root = profile.modules[""]
    assert len(root.ops) == len(seen["names"]) > 0
    assert {call.seconds for record in profile.modules.values() for call in record.ops} == {2e-3}
    # Module times follow their operators' medians, scaled to the clean forward.
    first = profile.modules["first"]
    ratio = first.forward_time / root.forward_time
    assert ratio == pytest.approx(len(first.ops) / len(root.ops))


def test_noise_follows_the_hosts_jitter() -> None:
    backend = accel.get_backend("cpu")
    with simulated(0, jitter=0.0, load=1.0):
        quiet = profile_step(_Net(), _inputs(), backend)
    with simulated(0, jitter=0.3, load=1.0):
        noisy = profile_step(_Net(), _inputs(), backend)
    assert quiet.noise == 0.0
    # 30% jitter a call: a median of three about 0.3 * sqrt(pi / 2) / sqrt(3) = 0.22.
    assert 0.1 < noisy.noise < 0.4


class _Growing(nn.Module):
    """Runs one more operator at each call: no call of one forward matches the next's."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        for _ in range(self.calls):
            x = x * 2
        return x


def test_forwards_that_run_other_operators_keep_the_first_timings() -> None:
    backend = accel.get_backend("cpu")
    model = _Growing()
    model.calls = 1  # as after the recorded forward: one multiplication
    first = [1.0]
    found = repeated(model, (torch.ones(3),), backend, ["aten.mul.Tensor"], first, False)
    assert found == (first, 0.0)
    assert model.calls == 2  # it stopped at the first forward that did not match
    assert REPEATS == 3
