"""Plans that do not follow timing noise, and budgets that never buy a slower plan.

The planner's clock is replaced by a simulated host (:mod:`._simulated_host`): time
advances only by a cost model of the operators that run, scaled by seeded noise. Nothing
here reads real time, so the tests are deterministic on any machine; each seed replays a
different noise.

What is held here is the planner's present reach: the same plan under six seeds of
30% per-operator jitter with a steady load, for the ResNet-style CNN and GPT-2, and for
BERT, Llama, ViT and the custom-layer stack where the operator grain exists (torch 2.5
and later); each operator's time is a median over three profiled forwards, and options
the timing cannot tell from checkpointing their module whole are set aside. It does not
yet hold everywhere: BERT and Llama took two or three plans in 6 seeds on torch 2.4.1,
and with a load that jumps between 1x and 3x within a forward most families took two
to six (docs/memory-budget-planning.md gives the counts and what was tried).
"""

from __future__ import annotations

import copy
import importlib.util
import itertools
import math
import sys
from dataclasses import replace
from typing import Any

import pytest
from _simulated_host import simulated  # loaded by tests/conftest.py

from checkpointing import CheckpointPlan, plan_checkpointing
from checkpointing._decisions import FULL, SAVED, SELECTIVE
from checkpointing._options import Option
from checkpointing._profile import ModuleProfile, OpCall, StepProfile
from checkpointing._selective import unavailable_reason
from checkpointing._timed import steady

zoo = sys.modules["accel_zoo"]  # loaded by tests/conftest.py
needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="transformers is not installed (pip install -e '.[test]')",
)
# Without the operator grain (torch < 2.5) BERT and Llama have more near-tied options (a
# small norm checkpointed whole, or the module beside it) and took two plans in 6 seeds.
NO_SELECTIVE = unavailable_reason()
needs_selective = pytest.mark.skipif(
    NO_SELECTIVE is not None, reason=f"operator-grain checkpointing: {NO_SELECTIVE}"
)
_plans: dict[tuple[str, float, int], CheckpointPlan] = {}


def _plan(family: str, budget: float, seed: int) -> CheckpointPlan:
    key = (family, budget, seed)
    if key not in _plans:
        case = zoo.build(family)
        with simulated(seed, load=1.0):
            _plans[key] = plan_checkpointing(copy.deepcopy(case.model), case.inputs, budget)
    return _plans[key]


def _decided(plan: CheckpointPlan) -> tuple[Any, ...]:
    """What the plan does (its recorded timings aside)."""
    taken = [c.label for c in plan.considered if c.taken]
    saved = {
        name: (
            saved.positions,
            {k: [(c.name, c.occurrence) for c in calls] for k, calls in saved.recipes.items()},
        )
        for name, saved in plan.saved_plans.items()
    }
    return plan.decisions, plan.kept_calls, saved, taken


@pytest.mark.parametrize(
    "family",
    [
        "resnet",
        pytest.param("gpt2", marks=needs_transformers),
        *(pytest.param(f, marks=[needs_transformers, needs_selective]) for f in ("bert", "llama")),
        *(pytest.param(f, marks=needs_selective) for f in ("vit", "custom")),
    ],
)
def test_same_model_inputs_and_budget_give_the_same_plan_under_timing_noise(
    family: str,
) -> None:
    plans = [_plan(family, 0.5, seed) for seed in range(6)]
    first = _decided(plans[0])
    assert first[0], "the plan checkpoints something"
    for plan in plans[1:]:
        assert _decided(plan) == first
    for plan in plans:
        taken = [c for c in plan.considered if c.taken]
        assert len(taken) == 1 and taken[0].reason.startswith("taken: ")
        assert all(c.reason.startswith("not taken: ") for c in plan.considered if not c.taken)


@needs_transformers
def test_a_looser_budget_never_gets_a_slower_plan() -> None:
    plans = [_plan("gpt2", budget, 0) for budget in (0.75, 0.5, 0.25)]
    ratios = [plan.estimated_step_time_ratio for plan in plans]
    assert ratios == sorted(ratios)
    recompute = [sum(row.recompute_seconds for row in plan.rows) for plan in plans]
    assert recompute == sorted(recompute)
    for looser, tighter in itertools.pairwise(plans):
        assert tighter.estimated_bytes <= looser.budget_bytes  # the tighter plan fits too


def _timed_as(monkeypatch: pytest.MonkeyPatch, others: list[float]) -> None:
    """In-place timings: the first plan 1.0 s every round, the others ``others``."""

    def steps(model: Any, inputs: Any, backend: Any, applies: list[Any]) -> list[list[float]]:
        return [[1.0] * len(others), *[others] * (len(applies) - 1)]

    monkeypatch.setattr("checkpointing._budget.measured_steps", steps)


@pytest.mark.parametrize(
    ("rounds", "taken"),
    [
        ([0.5, 0.5, 0.5, 0.5, 1.2], False),  # four wins by far, one loss: not separated
        ([0.9, 0.94, 0.8, 0.9, 0.7], True),  # faster by 5% or more in every round
    ],
)
def test_every_block_whole_overrules_the_estimate_only_when_every_round_agrees(
    monkeypatch: pytest.MonkeyPatch, rounds: list[float], taken: bool
) -> None:
    _timed_as(monkeypatch, rounds)
    case = zoo.build("resnet")
    plan = plan_checkpointing(copy.deepcopy(case.model), case.inputs, 0.5)
    full = next(c for c in plan.considered if c.label == "every block: checkpoint")
    assert full.measured_seconds is not None  # timed against the estimate's choice
    assert full.taken is taken
    if taken:
        assert full.reason.startswith("taken: timed in place") and "5 of them" in full.reason
    else:
        assert "did not separate" in full.reason and "4 of them faster" in full.reason


def test_options_the_timing_cannot_tell_from_the_whole_module_are_set_aside() -> None:
    calls = [OpCall("aten.mm.default", n, 1e-3, (), (), (), False) for n in range(4)]
    profile = StepProfile({"m": ModuleProfile("m", ops=calls)}, {}, {}, math.nan, 1.0, noise=0.1)
    full = Option(FULL, 100, 1.0, frozenset())
    close = Option(SAVED, 80, 0.9, frozenset())  # 10% faster: within 3 x 5% of noise
    faster = Option(SAVED, 80, 0.8, frozenset())  # 20% faster: measurably so
    more = Option(SELECTIVE, 120, 0.99, frozenset())  # saves more than the whole module
    kept, set_aside = steady(profile, {"m": [full, close, faster, more]})
    # The module's noise: 0.1 per call, four equal calls: 0.1 * sqrt(4) / 4 = 0.05.
    assert kept == {"m": [full, faster, more]} and set_aside == 1
    quiet = replace(profile, noise=0.0)  # no measured noise: nothing set aside
    assert steady(quiet, {"m": [full, close]}) == ({"m": [full, close]}, 0)
