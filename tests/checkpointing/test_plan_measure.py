"""``CheckpointPlan.measure``: one real step under a plan, beside the plan's figures."""

from __future__ import annotations

import copy
import dataclasses
import warnings

import pytest
import torch
from torch import nn

from checkpointing import CheckpointPlan, Decision, PlanMeasurement, plan_checkpointing


class _Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.down(torch.nn.functional.gelu(self.up(self.norm(x)))))


def _model() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(8, 32),
        *(_Block(32) for _ in range(4)),
        nn.Flatten(0, 1),
        nn.BatchNorm1d(32),  # running statistics the measurement must put back
        nn.Linear(32, 4),
    )
    return model.train(), (torch.randn(4, 16, 8),)


def _planned(budget: float = 0.5) -> tuple[nn.Module, tuple[torch.Tensor], CheckpointPlan]:
    model, inputs = _model()
    plan = plan_checkpointing(model, inputs, budget)
    plan.apply(model)
    return model, inputs, plan


def _state(model: nn.Module) -> list[torch.Tensor]:
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    return [
        *(p.detach().clone() for p in model.parameters()),
        *grads,
        *(b.clone() for b in model.buffers()),
        torch.get_rng_state(),
    ]


def _same(before: list[torch.Tensor], after: list[torch.Tensor]) -> bool:
    return len(before) == len(after) and all(
        torch.equal(a, b) for a, b in zip(before, after, strict=True)
    )


def test_a_step_within_budget_matches_the_estimate_and_does_not_warn() -> None:
    model, inputs, plan = _planned()
    with warnings.catch_warnings():
        # torch 2.4's own recomputation warns (FutureWarning) about torch.cpu.amp.autocast.
        warnings.simplefilter("error", UserWarning)
        report = plan.measure(model, inputs)
    assert isinstance(report, PlanMeasurement)
    assert not report.over_budget
    assert report.activation_bytes <= plan.budget_bytes + 0.02 * plan.plain_bytes
    assert report.estimate_error <= 0.02, report
    assert (report.estimated_bytes, report.budget_bytes) == (
        plan.estimated_bytes,
        plan.budget_bytes,
    )
    assert report.plain_bytes == plan.plain_bytes and report.backend == "cpu"
    # Nothing is timed unless asked for.
    assert report.step_time_ratio is None and report.measured_plain_bytes is None
    assert "measured on cpu" in str(report) and "step time" not in str(report)


def test_a_step_over_budget_warns_with_the_figures() -> None:
    model, inputs, plan = _planned()
    # The same model and checkpointing, said to have been planned for a quarter of the
    # budget: the step holds more than that budget plus 2% of the plain bytes.
    tight = dataclasses.replace(plan, budget_bytes=plan.budget_bytes // 4)
    with pytest.warns(UserWarning, match="over its budget") as caught:
        report = tight.measure(model, inputs)
    assert report.over_budget
    (message,) = [str(w.message) for w in caught if "over its budget" in str(w.message)]
    assert "MiB" in message and "plan estimated" in message
    assert "over budget" in str(report)


def test_the_model_state_is_put_back() -> None:
    model, inputs, plan = _planned()
    for param in model.parameters():  # gradients of an earlier step, to be kept
        param.grad = torch.full_like(param, 0.5)
    torch.manual_seed(3)
    before = _state(model)
    plan.measure(model, inputs, timed=True)
    assert _same(before, _state(model))


def test_the_model_state_is_put_back_after_an_exception() -> None:
    model, inputs, plan = _planned()
    torch.manual_seed(3)
    before = _state(model)
    wrapped = [type(module).__name__ for module in model.children()]

    def fail(module: nn.Module, args: object, output: object) -> None:
        raise RuntimeError("a failure after batch norm updated its statistics")

    handle = model[-1].register_forward_hook(fail)
    with pytest.raises(RuntimeError, match="after batch norm"):
        plan.measure(model, inputs, timed=True)
    handle.remove()
    assert _same(before, _state(model))
    assert [type(module).__name__ for module in model.children()] == wrapped


def test_timed_measures_the_plain_step_and_leaves_the_plan_applied() -> None:
    model, inputs, plan = _planned()
    reference, _ = _model()
    report = plan.measure(model, inputs, timed=True)
    assert report.step_time_ratio is not None and report.step_time_ratio > 0
    assert report.step_seconds is not None and report.plain_step_seconds is not None
    assert report.measured_plain_bytes is not None
    assert abs(report.measured_plain_bytes - plan.plain_bytes) <= 0.02 * plan.plain_bytes
    assert "step time" in str(report)
    # Still checkpointed as planned: the same gradients as the plain model's.
    for module in (model, reference):
        torch.manual_seed(5)
        module(*inputs).square().mean().backward()
    for mine, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        assert mine.grad is not None and torch.equal(mine.grad, theirs.grad)
    assert plan.measure(copy.deepcopy(model), inputs).activation_bytes < plan.plain_bytes


def test_a_model_the_plan_was_not_applied_to_is_refused() -> None:
    model, inputs = _model()
    plan = plan_checkpointing(model, inputs, 0.5)
    with pytest.raises(ValueError, match=r"plan\.apply\(model\) first"):
        plan.measure(model, inputs)
    other, _ = _model()
    plan.apply(other)
    with pytest.raises(ValueError, match="input"):
        plan.measure(other, (torch.randn(2, 16, 8),))


def test_a_model_checkpointed_whole_is_measured_and_stays_checkpointed() -> None:
    from checkpointing._root import root_checkpointed

    model, inputs = _model()
    plain = plan_checkpointing(model, inputs, 0.5).plain_bytes
    whole = CheckpointPlan(
        choices={"": Decision("checkpoint")},
        rows=(),
        plain_bytes=plain,
        estimated_bytes=0,
        estimated_step_time_ratio=1.3,
        budget_bytes=plain // 10,
        step_seconds=1.0,
    )
    whole.apply(model)
    report = whole.measure(model, inputs, timed=True)
    assert not report.over_budget and report.activation_bytes < plain // 10
    assert report.measured_plain_bytes == plain
    assert root_checkpointed(model)
