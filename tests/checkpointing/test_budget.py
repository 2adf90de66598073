"""Checkpointing to a memory budget: plans fit, stay exact, and bad budgets are explained."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
import torch
from torch import nn

import checkpointing
from accel._compat import fake_profile_unavailable
from accel.testing import RecordingBackend
from checkpointing import (
    CheckpointPlan,
    Decision,
    apply_activation_checkpointing,
    plan_checkpointing,
)
from checkpointing._decisions import FULL, SAVED, SELECTIVE
from checkpointing._measure import LiveActivationMeter
from checkpointing._selective import unavailable_reason
from checkpointing._selective_wrapper import SelectiveCheckpointWrapper

NO_SELECTIVE = unavailable_reason()
needs_selective = pytest.mark.skipif(
    NO_SELECTIVE is not None, reason=f"operator-grain checkpointing: {NO_SELECTIVE}"
)


# A plan's figures do not matter to apply(); only its decisions do.
_FIELDS: dict[str, Any] = {
    "rows": (),
    **dict.fromkeys(("plain_bytes", "estimated_bytes", "budget_bytes"), 1),
    **dict.fromkeys(("estimated_step_time_ratio", "step_seconds"), 1.0),
}


class Block(nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, 4, dropout=0.1, batch_first=True)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.Dropout(0.1)
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        normed = self.norm(hidden)
        attended, _ = self.attention(normed, normed, normed, need_weights=False)
        hidden = hidden + attended
        return hidden + self.mlp(hidden)


class Net(nn.Module):
    def __init__(self, layers: int = 4, width: int = 32) -> None:
        super().__init__()
        self.embed = nn.Linear(width, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(layers))
        self.head = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(x)
        for block in self.blocks:
            hidden = block(hidden)
        return self.head(hidden)


def _model() -> Net:
    torch.manual_seed(0)
    return Net().train()


def _inputs() -> torch.Tensor:
    return torch.randn(4, 16, 32, generator=torch.Generator().manual_seed(1))


def _step(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    torch.manual_seed(7)
    out = model(x)
    out.square().mean().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]


def _assert_same_step(model: nn.Module, reference: nn.Module, x: torch.Tensor) -> None:
    out, grads = _step(model, x)
    expected_out, expected_grads = _step(reference, x)
    assert torch.equal(out, expected_out)
    assert all(torch.equal(a, b) for a, b in zip(grads, expected_grads, strict=True))


def _live_bytes(model: nn.Module, x: torch.Tensor) -> int:
    with LiveActivationMeter(exclude=[*model.parameters(), *model.buffers()]) as meter:
        out = model(x)
    return meter.bytes - out.untyped_storage().nbytes()  # the graph lives while out does


@pytest.mark.parametrize("budget", [0.75, 0.5, 0.25])
def test_budget_is_bit_exact_with_dropout_and_fits(budget: float) -> None:
    plain, model, x = _model(), _model(), _inputs()
    wrapped = apply_activation_checkpointing(model, memory_budget=budget, example_inputs=(x,))
    assert wrapped
    _assert_same_step(model, plain, x)
    assert _live_bytes(model, x) <= budget * _live_bytes(plain, x)


@needs_selective
@pytest.mark.parametrize("decision", [FULL, SELECTIVE])
def test_each_grain_is_bit_exact_with_dropout(decision: str) -> None:
    plain, model, x = _model(), _model(), _inputs()
    choices = dict.fromkeys(("blocks.0", "blocks.2"), Decision(decision))
    plan = CheckpointPlan(choices=choices, **_FIELDS)
    assert plan.apply(model) == ["blocks.0", "blocks.2"]
    kind = SelectiveCheckpointWrapper if decision == SELECTIVE else checkpointing.CheckpointWrapper
    assert type(model.blocks[0]) is kind
    _assert_same_step(model, plain, x)
    assert _live_bytes(model, x) < _live_bytes(plain, x)


@needs_selective
def test_selective_keeps_matmul_outputs_and_saves_less_than_plain() -> None:
    plain, model, x = _model(), _model(), _inputs()
    decisions = {f"blocks.{i}": Decision(SELECTIVE) for i in range(4)}
    full = {f"blocks.{i}": Decision(FULL) for i in range(4)}
    CheckpointPlan(choices=decisions, **_FIELDS).apply(model)
    whole = _model()
    CheckpointPlan(choices=full, **_FIELDS).apply(whole)
    assert _live_bytes(whole, x) < _live_bytes(model, x) < _live_bytes(plain, x)


def test_plan_estimates_and_prints_a_table() -> None:
    model, x = _model(), _inputs()
    plan = plan_checkpointing(model, (x,), memory_budget=0.5)
    assert plan.estimated_bytes <= plan.budget_bytes == int(0.5 * plan.plain_bytes)
    assert plan.estimated_step_time_ratio > 1.0
    text = str(plan)
    for word in ("module", "grain", "activations kept", "recompute", "decision", "blocks."):
        assert word in text
    assert all(name in text for name in plan.decisions)
    assert not any(isinstance(m, checkpointing.CheckpointWrapper) for m in model.modules())
    untouched = plan_checkpointing(model, (x,), memory_budget=1.0)
    assert untouched.decisions == {} and untouched.estimated_step_time_ratio == 1.0
    assert untouched.estimated_bytes == untouched.plain_bytes


def test_int_budget_is_bytes() -> None:
    model, x = _model(), _inputs()
    plain_bytes = plan_checkpointing(model, (x,), memory_budget=1.0).plain_bytes
    plan = plan_checkpointing(model, (x,), memory_budget=plain_bytes // 3)
    assert plan.budget_bytes == plain_bytes // 3 and plan.estimated_bytes <= plain_bytes // 3


def test_planning_leaves_parameters_gradients_buffers_and_rng_alone() -> None:
    model = nn.Sequential(
        nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Dropout(0.5)),
        nn.Sequential(nn.Linear(8, 8), nn.ReLU()),
    ).train()
    model[0][0].weight.grad = torch.ones(8, 8)
    state = copy.deepcopy(model.state_dict())
    x = torch.randn(16, 8)
    rng = torch.get_rng_state()
    plan_checkpointing(model, (x,), memory_budget=0.5)
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert torch.equal(model[0][0].weight.grad, torch.ones(8, 8))
    assert model[1][0].weight.grad is None


@pytest.mark.skipif(
    fake_profile_unavailable() is not None,
    reason=f"profiles a real forward here: {fake_profile_unavailable()}",
)
def test_planning_runs_one_forward_without_grad_and_no_step_on_the_device() -> None:
    backend = RecordingBackend()
    model = _model()
    modes: list[bool] = []
    model.register_forward_pre_hook(lambda *_: modes.append(torch.is_grad_enabled()))
    plan_checkpointing(model, (_inputs(),), memory_budget=0.5, backend=backend)
    # Fake tensors: no step is run, synchronized, flushed or seeded on the device. One
    # real forward without grad, its generators forked, first records how the calls are
    # made, for the fake step to make them alike.
    assert modes == [False, True], "the real forward without grad, then the fake step"
    assert backend.count("fork_rng") == 1
    for call in ("synchronize", "mark_step", "manual_seed", "get_rng_state"):
        assert backend.count(call) == 0, call


def test_without_operator_grain_plans_whole_modules_and_saved_tensors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reason = "torch 2.4.1 has no torch.utils.checkpoint.create_selective_checkpoint_contexts"
    monkeypatch.setattr("checkpointing.planner._planning.unavailable_reason", lambda: reason)
    plan = plan_checkpointing(_model(), (_inputs(),), memory_budget=0.5)
    assert set(plan.decisions.values()) <= {FULL, SAVED}
    assert reason in plan.note and reason in str(plan)


def test_budget_with_check_fn_is_an_error() -> None:
    model = _model()
    with pytest.raises(ValueError, match=r"^checkpointing: memory_budget and check_fn were both"):
        apply_activation_checkpointing(
            model, lambda m: True, memory_budget=0.5, example_inputs=(_inputs(),)
        )
    assert not any(isinstance(m, checkpointing.CheckpointWrapper) for m in model.modules())


def test_budget_without_example_inputs_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"memory_budget needs example_inputs"):
        apply_activation_checkpointing(_model(), memory_budget=0.5)


def test_unreachable_budget_names_the_smallest_fraction() -> None:
    with pytest.raises(ValueError, match=r"is below what checkpointing can reach") as error:
        plan_checkpointing(_model(), (_inputs(),), memory_budget=0.001)
    message = str(error.value)
    smallest = float(message.split("the smallest reachable is ")[1].split(" ")[0])
    assert 0.001 < smallest < 1.0
    plan = plan_checkpointing(_model(), (_inputs(),), memory_budget=min(smallest + 0.01, 1.0))
    assert plan.estimated_bytes <= plan.budget_bytes


@pytest.mark.parametrize(
    ("budget", "error", "match"),
    [
        (0.0, ValueError, r"memory_budget=0\.0 is out of range"),
        (1.5, ValueError, r"memory_budget=1\.5 is out of range"),
        (-3, ValueError, r"memory_budget=-3 bytes is out of range"),
        ("half", TypeError, r"must be a float fraction .* not str 'half'"),
        (True, TypeError, r"not bool True"),
    ],
)
def test_bad_budgets_are_explained(budget: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        plan_checkpointing(_model(), (_inputs(),), memory_budget=budget)
    with pytest.raises(error, match=match):
        apply_activation_checkpointing(_model(), memory_budget=budget, example_inputs=(1,))


def test_plan_for_another_model_is_refused() -> None:
    plan = plan_checkpointing(_model(), (_inputs(),), memory_budget=0.5)
    other = nn.Sequential(nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"is not built like the one the plan was made for: "):
        plan.apply(other)
    assert not isinstance(other[0], checkpointing.CheckpointWrapper)
    with pytest.raises(ValueError, match=r"which the model does not have"):
        dataclasses.replace(plan, structure=()).apply(other)


class _AsynchronousRecording(RecordingBackend):
    is_asynchronous = True


class _LazyRecording(RecordingBackend):
    is_lazy = True


def test_lazy_and_asynchronous_backends_get_the_hosts_plan_without_device_calls() -> None:
    plans = [
        plan_checkpointing(_model(), (_inputs(),), memory_budget=0.5, backend=backend)
        for backend in (RecordingBackend(), _AsynchronousRecording(), _LazyRecording())
    ]
    assert all(plan.to_dict() == plans[0].to_dict() for plan in plans)


class _StatsRecording(RecordingBackend):
    supports_memory_stats = True


def test_devices_with_memory_statistics_report_planning_peak() -> None:
    backend = _StatsRecording()
    plan = plan_checkpointing(_model(), (_inputs(),), memory_budget=0.5, backend=backend)
    backend.assert_order("memory_allocated", "reset_peak_memory_stats", "max_memory_allocated")
    assert plan.device_bytes == plan.device_peak_bytes == 0  # the host reports 0
    assert "device memory while planning (the device's statistics)" in str(plan)
    assert "device memory" not in str(plan_checkpointing(_model(), (_inputs(),), 0.5))


def test_selective_cache_stays_outside_saved_tensor_hooks() -> None:
    from types import SimpleNamespace

    from accel._compat import keep_selective_cache_outside_hooks

    newer = SimpleNamespace(respect_saved_tensors_hooks=None)  # torch 2.15's caching mode
    older = SimpleNamespace()
    keep_selective_cache_outside_hooks(newer)
    keep_selective_cache_outside_hooks(older)
    assert newer.respect_saved_tensors_hooks is False and vars(older) == {}


def test_non_reentrant_inputs_survive_until_backward() -> None:
    # torch 2.4 freed the saved inputs once the saving node's output was dropped.
    layer = nn.Sequential(nn.Linear(4, 4), nn.GELU())
    x = torch.randn(2, 4, requires_grad=True)
    checkpointing.checkpoint(layer, x, use_reentrant=False).sum().backward()
    assert x.grad is not None
