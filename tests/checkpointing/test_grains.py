"""Grains as named strategies: one tagged decision per call, files of both formats, a new grain.

A plan holds one :class:`Decision` per module call (its grain's name and payload); its
read-only views (``decisions``, ``kept_calls``, ``saved_plans``) are what the three
parallel mappings used to be. Files of format ``/1``, written before, load as the same
decisions and train exactly; another format is refused with a sentence. A grain added
by one module and registered alone plans, saves, loads and applies, and the other
grains' options stay as they were.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import accel
from checkpointing import CheckpointPlan, Decision, plan_checkpointing
from checkpointing._decisions import CHOSEN, FULL, SAVED
from checkpointing._saved_plan import SavedPlan
from checkpointing._selective import unavailable_reason
from checkpointing._selective_wrapper import SelectiveCheckpointWrapper
from checkpointing._wrapper import CheckpointWrapper
from checkpointing.planner import builtin_rates, cost
from checkpointing.planner._grains import _registry, candidates, grain_named
from checkpointing.planner._grains._keep import Keep
from checkpointing.planner._options import Call, Option
from checkpointing.planner._profile import profile_step

# A plan written by the release before grains were strategies (format /1, three
# parallel mappings), for ``_model()``: block "0" keeps its chosen calls, block "1"
# recomputes saved tensors.
V1_FILE = Path(__file__).resolve().parents[1] / "data" / "checkpoint-plan-v1.json"

needs_selective = pytest.mark.skipif(
    unavailable_reason() is not None, reason=f"selective checkpoint: {unavailable_reason()}"
)


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        *(nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4)) for _ in range(2))
    )


def _inputs() -> tuple[torch.Tensor]:
    return (torch.randn(2, 4, generator=torch.Generator().manual_seed(1)),)


def _step(model: nn.Module) -> list[torch.Tensor]:
    (x,) = _inputs()
    loss = model(x).square().sum()
    loss.backward()
    found = [loss.detach(), *(p.grad for p in model.parameters() if p.grad is not None)]
    model.zero_grad(set_to_none=True)
    return found


def _exact(model: nn.Module) -> bool:
    return all(torch.equal(a, b) for a, b in zip(_step(model), _step(_model()), strict=True))


def test_a_plan_holds_one_tagged_decision_per_call_and_its_views() -> None:
    plan = CheckpointPlan.load(V1_FILE)
    assert set(plan.choices) == {"0", "1"}
    assert plan.choices["0"] == Decision(CHOSEN, (("aten.tanh.default", 0),))
    assert plan.choices["1"].grain == SAVED and isinstance(plan.choices["1"].payload, SavedPlan)
    assert plan.decisions == {"0": CHOSEN, "1": SAVED}
    assert plan.kept_calls == {"0": (("aten.tanh.default", 0),)}
    assert plan.saved_plans == {"1": plan.choices["1"].payload}


def test_a_file_of_format_1_loads_saves_as_format_2_and_trains_exactly(tmp_path: Path) -> None:
    old = json.loads(V1_FILE.read_text())
    plan = CheckpointPlan.load(V1_FILE)
    # Everything but the decisions is as the old file had it; its rates read the copy
    # rates added since as their defaults, it encloses no call (none was recorded), and
    # it has no compiled estimate (none was made).
    same = {
        "format",
        "decisions",
        "kept_calls",
        "saved_plans",
        "rates",
        "enclosed",
        "compiled_estimated_bytes",
    }
    new = plan.to_dict()
    assert "enclosed" not in old and new["enclosed"] == {}
    assert "compiled_estimated_bytes" not in old and plan.compiled_estimated_bytes is None
    assert {k: v for k, v in new.items() if k not in same} == {
        k: v for k, v in old.items() if k not in same
    }
    later = {
        "to_host_bytes": 25e9,
        "to_device_bytes": 25e9,
        "replay_seconds": 1e-4,
        "region_seconds": 0.0,
        "saved_call_seconds": 0.0,
        "region_tensor_seconds": 0.0,
        "attention_score_seconds": 0.0,
    }
    assert new["rates"] == {**old["rates"], **later, "pack_bytes": 9.5e8}
    assert new["format"] == "accel.checkpoint-plan/2"
    assert new["decisions"]["0"] == {"grain": CHOSEN, "payload": old["kept_calls"]["0"]}
    assert new["decisions"]["1"] == {"grain": SAVED, "payload": old["saved_plans"]["1"]}
    plan.save(tmp_path / "plan.json")
    again = CheckpointPlan.load(tmp_path / "plan.json")
    assert again == plan and again.to_dict() == new and str(again) == str(plan)
    if unavailable_reason() is None:  # "keep costly ops" needs torch's selective checkpoint
        model = _model()
        assert again.apply(model, example_inputs=_inputs()) == ["0", "1"]
        assert isinstance(model[0], SelectiveCheckpointWrapper) and _exact(model)


@pytest.mark.parametrize("found", ["accel.checkpoint-plan/3", "accel.checkpoint-plan/0", None])
def test_a_plan_file_of_another_format_is_refused_naming_both(
    tmp_path: Path, found: str | None
) -> None:
    value = json.loads(V1_FILE.read_text())
    value["format"] = found
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(value))
    with pytest.raises(
        ValueError, match=r"^checkpointing: this is not a saved checkpoint"
    ) as error:
        CheckpointPlan.load(path)
    message = str(error.value)
    assert repr(found) in message and "plan again" in message
    assert "'accel.checkpoint-plan/2' or 'accel.checkpoint-plan/1'" in message


def test_a_payload_a_grain_does_not_take_is_refused_before_wrapping() -> None:
    plan = CheckpointPlan.load(V1_FILE)
    bad = Decision(FULL, (("aten.tanh.default", 0),))
    wrong = CheckpointPlan(**{**plan.__dict__, "choices": {"1": plan.choices["1"], "0": bad}})
    model = _model()
    with pytest.raises(ValueError, match=r"^checkpointing: this plan gives '0' \('checkpoint'\)"):
        wrong.apply(model)
    assert not any(isinstance(m, CheckpointWrapper) for m in model.modules())
    value = plan.to_dict()
    value["decisions"]["0"] = {"grain": FULL, "payload": [["aten.tanh.default", 0]]}
    with pytest.raises(ValueError, match=r"incomplete or damaged"):
        CheckpointPlan.from_dict(value)


class _Untouched(Keep):
    """A test-only grain: keeps everything, under another name, and says where it ran."""

    name = "keep, under a test name"
    coarseness = 5
    margin = 0.0

    def options(self, call: Call) -> list[Option]:
        return [call.option(self.name, 0.0, call.mine | call.inputs, kind="kept")]

    def wrapper(
        self,
        module: nn.Module,
        payload: None,
        *,
        name: str,
        preserve_rng_state: bool,
        backend: accel.Accelerator | None,
    ) -> nn.Module:
        module.untouched_by_plan = name  # type: ignore[assignment]
        return module


def test_a_grain_registered_alone_plans_saves_loads_and_applies(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    grain = _Untouched()
    recorded = profile_step(_model(), _inputs(), accel.get_backend("cpu"))
    profile = cost(recorded, builtin_rates("cpu"))
    before = candidates(profile, selective=True)
    monkeypatch.setattr(_registry, "GRAINS", (*_registry.GRAINS, grain))
    assert grain_named(grain.name) is grain
    after = candidates(profile, selective=True)
    # Its options come last; every other grain's are as they were.
    for name, options in after.items():
        assert options[:-1] == before[name] and options[-1].decision == grain.name
    plan = plan_checkpointing(_model(), _inputs(), 0.5)
    assert plan.margins[grain.name] == 0.0 and grain.name not in plan.decisions.values()
    mine = CheckpointPlan(**{**plan.__dict__, "choices": {"0": Decision(grain.name)}})
    mine.save(tmp_path / "plan.json")
    assert json.loads((tmp_path / "plan.json").read_text())["decisions"] == {
        "0": {"grain": grain.name}
    }
    loaded = CheckpointPlan.load(tmp_path / "plan.json")
    assert loaded == mine
    model = _model()
    assert loaded.apply(model, example_inputs=_inputs()) == ["0"]
    assert model[0].untouched_by_plan == "0" and not hasattr(model[1], "untouched_by_plan")
    assert _exact(model)
    # Where it is not registered, the plan loads and its apply refuses it with a sentence.
    monkeypatch.undo()
    with pytest.raises(ValueError, match=r"'keep, under a test name' for '0', which this"):
        CheckpointPlan.load(tmp_path / "plan.json").apply(_model())


@needs_selective
def test_each_grain_owns_what_it_offers_and_how_it_runs() -> None:
    model = _model()
    recorded = profile_step(copy.deepcopy(model), _inputs(), accel.get_backend("cpu"))
    profile = cost(recorded, builtin_rates("cpu"))
    offered = {
        option.decision for options in candidates(profile, True).values() for option in options
    }
    assert {FULL, CHOSEN, SAVED} <= offered
    for name in offered:
        grain = grain_named(name)
        assert grain is not None and grain.margin >= 0.0 and grain.coarseness is not None
    kept: Any = grain_named(CHOSEN)
    assert kept.decode(kept.encode((("aten.tanh.default", 0),))) == (("aten.tanh.default", 0),)
    with pytest.raises(ValueError, match=r"keeps chosen operator calls in 'x' but names none"):
        kept.check("x", None)


def test_each_grain_names_the_rate_its_wrapper_costs_per_call() -> None:
    from checkpointing._decisions import ALTERNATE, KEEP, OFFLOADED, SELECTIVE
    from checkpointing.planner import DeviceRates

    # Checkpoints pay torch's checkpoint once a call, the saved grain its wrapper; the
    # search's grains besides them have no wrapper of their own to pay for.
    assert {grain.name: grain.call_cost for grain in _registry.GRAINS} == {
        FULL: "region_seconds",
        SAVED: "saved_call_seconds",
        SELECTIVE: "region_seconds",
        ALTERNATE: "region_seconds",
        CHOSEN: "region_seconds",
        KEEP: None,
        OFFLOADED: None,
    }
    # And the checkpoints pay a hook for each tensor the call saves.
    assert {grain.name: grain.tensor_cost for grain in _registry.GRAINS} == {
        FULL: "region_tensor_seconds",
        SAVED: None,
        SELECTIVE: "region_tensor_seconds",
        ALTERNATE: "region_tensor_seconds",
        CHOSEN: "region_tensor_seconds",
        KEEP: None,
        OFFLOADED: None,
    }
    for grain in _registry.GRAINS:
        for rate in (grain.call_cost, grain.tensor_cost):
            assert rate is None or rate in DeviceRates.__dataclass_fields__
