"""Saved-tensor grain: a tensor an earlier recipe reads dropped too, recipes priced as they run."""

from __future__ import annotations

import collections
import copy
from typing import Any

import torch
from _same_steps import assert_same_steps, step  # loaded by tests/conftest.py
from torch import nn

import accel
from checkpointing._saved_plan import DROP, SavedPlan
from checkpointing._saved_wrapper import SavedTensorWrapper
from checkpointing.planner import builtin_rates, cost
from checkpointing.planner._profile import profile_step
from checkpointing.planner._records import StepProfile
from checkpointing.planner._saved_grain import (
    SavedUnit,
    prefix_seconds,
    recipe_runs,
    saved_plan,
    saved_units,
)

WIDTH, SEQ, BATCH = 16, 8, 2
# Wide enough that a matrix product costs more per byte than the SiLU and the product.
GATED = 256


class _SwiGLU(nn.Module):
    """A gated MLP: the SiLU reads the gate's product, the product reads both branches."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(GATED, 2 * GATED, bias=False)
        self.up = nn.Linear(GATED, 2 * GATED, bias=False)
        self.down = nn.Linear(2 * GATED, GATED, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gated: torch.Tensor = nn.functional.silu(self.gate(x)) * self.up(x)
        out: torch.Tensor = x + self.down(gated)
        return out


class _Forked(nn.Module):
    """``exp(t) * sigmoid(t)`` with ``t = linear(x) + 1``: ``t`` is saved by nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.linear(x) + 1.0
        return torch.exp(hidden) * torch.sigmoid(hidden)


def _inputs(width: int = WIDTH) -> torch.Tensor:
    return torch.randn(BATCH, SEQ, width, generator=torch.Generator().manual_seed(1))


def _profile(model: nn.Module, x: torch.Tensor) -> StepProfile:
    return cost(profile_step(model, (x,), accel.get_backend("cpu")), builtin_rates("cpu"))


def _dropped(units: list[SavedUnit]) -> set[int]:
    return {index for unit in units if unit.action == DROP for index in unit.storages}


def _counted(plan: SavedPlan) -> collections.Counter[tuple[str, tuple[int | None, ...]]]:
    """Counts, from now on, each recorded call the plan's recipes run."""
    runs: collections.Counter[tuple[str, tuple[int | None, ...]]] = collections.Counter()

    def counting(func: Any, key: tuple[str, tuple[int | None, ...]]) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            runs[key] += 1
            return func(*args, **kwargs)

        return counted

    for steps in plan.recipes.values():
        for replay in steps:
            object.__setattr__(replay, "func", counting(replay.func, (replay.name, replay.outputs)))
    return runs


def _priced(plan: SavedPlan) -> collections.Counter[tuple[str, tuple[int | None, ...]]]:
    """How many times :func:`recipe_runs` says each recorded call runs in one backward."""
    saved_at: dict[int, int] = {}
    for position, (action, index) in sorted(plan.positions.items()):
        if action == DROP:
            saved_at[index] = position
    priced: collections.Counter[tuple[str, tuple[int | None, ...]]] = collections.Counter()
    for replay, times in recipe_runs(dict(plan.recipes), saved_at):
        priced[(replay.name, replay.outputs)] += times
    return priced


def test_a_tensor_an_earlier_recipe_reads_is_dropped_too() -> None:
    # The SiLU's and the product's outputs are the cheapest to drop; their recipes read
    # the matrix products' outputs. Those are dropped next, and the earlier recipes then
    # recompute them on the way instead of reading them.
    torch.manual_seed(0)
    reference, x = nn.Sequential(_SwiGLU()).train(), _inputs(GATED)
    profile = _profile(reference, x)
    prefixes = saved_units(profile, "0")
    longest = prefixes[-1]
    labels = [unit.label for unit in longest]
    assert {"silu", "mul"} <= set(labels) and "mm" in labels, labels
    assert labels.index("silu") < labels.index("mm"), "the products are dropped after the SiLU"
    dropped = _dropped(longest)
    for unit in longest:
        assert not unit.leaves & dropped, f"{unit.label} still reads a dropped tensor"
    for units in prefixes:
        model = copy.deepcopy(reference)
        model[0] = SavedTensorWrapper(model[0], saved_plan(profile, "0", units))
        assert_same_steps(model, copy.deepcopy(reference), x)


def test_a_call_that_writes_a_dropped_tensor_runs_once_and_is_priced_once() -> None:
    torch.manual_seed(0)
    reference, x = nn.Sequential(_SwiGLU()).train(), _inputs(GATED)
    profile = _profile(reference, x)
    longest = saved_units(profile, "0")[-1]
    plan = saved_plan(profile, "0", longest)
    runs = _counted(plan)
    model = copy.deepcopy(reference)
    model[0] = SavedTensorWrapper(model[0], plan)
    step(model, x)  # the first call is checked: its recipes run in the forward
    runs.clear()
    step(model, x)
    assert runs and set(runs.values()) == {1}, runs
    assert runs == _priced(plan)
    replay = profile.rates.replay_seconds
    separately = sum(unit.seconds for unit in longest)
    assert prefix_seconds(longest, profile.modules["0"].packs, replay) < separately


def test_an_intermediate_nothing_saves_runs_in_each_recipe_and_is_priced_so() -> None:
    torch.manual_seed(0)
    reference, x = nn.Sequential(_Forked()).train(), _inputs()
    profile = _profile(reference, x)
    longest = saved_units(profile, "0")[-1]
    assert {"exp", "sigmoid"} <= {unit.label for unit in longest}
    plan = saved_plan(profile, "0", longest)
    runs = _counted(plan)
    model = copy.deepcopy(reference)
    model[0] = SavedTensorWrapper(model[0], plan)
    step(model, x)
    runs.clear()
    step(model, x)
    assert max(runs.values()) == 2, "the shared sum runs in both recipes"
    assert runs == _priced(plan)
    replay = profile.rates.replay_seconds
    separately = sum(unit.seconds for unit in longest)
    priced = prefix_seconds(longest, profile.modules["0"].packs, replay)
    assert abs(priced - separately) <= 1e-12 * max(separately, 1.0)
    assert_same_steps(model, copy.deepcopy(reference), x)
