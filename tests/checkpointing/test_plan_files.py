"""Plans that last: saved as readable JSON, loaded back, refused where they do not fit.

A plan saved and loaded must be the same plan (every field), and applying the loaded
plan to a fresh model built the same way must train bit for bit like the plain model.
A plan refuses, with a sentence, a model built otherwise or inputs of other shapes,
and a file that is not a plan.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from _grain_rates import SAVED_GRAIN_FREE  # loaded by tests/conftest.py
from torch import nn

import checkpointing
from checkpointing import CheckpointPlan, plan_checkpointing
from checkpointing._decisions import CHOSEN, SAVED
from checkpointing._selective import unavailable_reason

zoo = sys.modules["accel_zoo"]  # loaded by tests/conftest.py


def _step(case: Any, model: nn.Module) -> list[torch.Tensor]:
    torch.manual_seed(5)
    loss = case.loss(model)
    loss.backward()
    grads = [loss.detach(), *(p.grad for p in model.parameters() if p.grad is not None)]
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("family", ["custom", "resnet", "shared"])
@pytest.mark.parametrize("budget", [0.5, 0.25])
def test_a_saved_plan_loads_as_the_same_plan_and_trains_exactly(
    family: str, budget: float, tmp_path: Path
) -> None:
    if family not in zoo.FAMILIES:
        pytest.skip(f"the zoo has no {family!r} family in this checkout")
    case = zoo.build(family)
    plan = plan_checkpointing(copy.deepcopy(case.model), case.inputs, budget)
    path = tmp_path / "plan.json"
    plan.save(path)
    text = path.read_text()
    assert json.loads(text)["format"] == "accel.checkpoint-plan/2" and "\n " in text  # indented
    loaded = CheckpointPlan.load(path)
    assert loaded.to_dict() == plan.to_dict()
    assert str(loaded) == str(plan)
    fresh = zoo.build(family)  # another process would build it so
    planned = copy.deepcopy(fresh.model)
    loaded.apply(planned, example_inputs=fresh.inputs)
    for mine, theirs in zip(_step(fresh, planned), _step(fresh, fresh.model), strict=True):
        assert torch.equal(mine, theirs)


def test_a_planned_model_pickles_and_trains_alike() -> None:
    import pickle

    case = zoo.build("shared")  # per-call wrappers around saved-tensor plans
    model = copy.deepcopy(case.model)
    plan_checkpointing(model, case.inputs, 0.5).apply(model)
    assert any(isinstance(m, checkpointing.PerCallWrapper) for m in model.modules())
    copied = pickle.loads(pickle.dumps(model))
    for mine, theirs in zip(_step(case, copied), _step(case, model), strict=True):
        assert torch.equal(mine, theirs)


def test_the_finer_grains_survive_the_file(tmp_path: Path) -> None:
    case = zoo.build("custom")
    found = set()
    for budget in (0.8, 0.6, 0.5, 0.4):
        model = copy.deepcopy(case.model)
        plan = plan_checkpointing(model, case.inputs, budget, rates=SAVED_GRAIN_FREE)
        found |= set(plan.decisions.values())
        plan.save(tmp_path / "plan.json")
        loaded = CheckpointPlan.load(tmp_path / "plan.json")
        assert loaded.saved_plans == plan.saved_plans
        assert loaded.kept_calls == plan.kept_calls
    assert SAVED in found or (CHOSEN in found and unavailable_reason() is None)


def test_a_model_built_otherwise_is_refused_before_anything_is_wrapped() -> None:
    case = zoo.build("custom")
    plan = plan_checkpointing(copy.deepcopy(case.model), case.inputs, 0.5)
    other = copy.deepcopy(case.model)
    first = next(p for p in other.parameters())
    first.data = torch.zeros(*first.shape[:-1], first.shape[-1] + 1)
    with pytest.raises(ValueError, match=r"^checkpointing: this model is not built like the one"):
        plan.apply(other)
    assert not any(isinstance(m, checkpointing.CheckpointWrapper) for m in other.modules())


def test_inputs_of_other_shapes_are_refused_with_both_shapes() -> None:
    case = zoo.build("custom")
    plan = plan_checkpointing(copy.deepcopy(case.model), case.inputs, 0.5)
    (x,) = case.inputs
    wider = (torch.cat([x, x]),)
    with pytest.raises(
        ValueError, match=r"not shaped like the ones the plan was made for"
    ) as error:
        plan.apply(copy.deepcopy(case.model), example_inputs=wider)
    assert str(list(wider[0].shape)) in str(error.value) and str(list(x.shape)) in str(error.value)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("{not json", r"is not JSON"),
        ('{"format": "something else"}', r"not a saved checkpoint plan of format"),
        ('{"format": "accel.checkpoint-plan/1"}', r"incomplete or damaged"),
    ],
)
def test_a_file_that_is_not_a_plan_is_refused(tmp_path: Path, content: str, match: str) -> None:
    path = tmp_path / "plan.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=match):
        CheckpointPlan.load(path)
