"""A memory-budget plan made and applied on the selected backend's device.

The planner profiles on fake tensors of the device's type, so it plans a model that
lives on any device, a lazy one (XLA) or one someone else wrote (openreg) included,
without running a kernel there. Each plan must be exact on the device (the loss and
every gradient bit-equal to the plain model's, dropout included) and keep no more than
its budget of what autograd saves (plus 2%), counted on the device. A GRU, profiled on
real tensors there, is planned and trains exactly as well.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings

import pytest
import torch
from torch import nn

from accel import Accelerator
from accel._compat import fake_profile_unavailable
from checkpointing import CheckpointPlan, SavedTensorMeter, plan_checkpointing, profile_step
from checkpointing.planner import builtin_rates


class _Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.down(torch.nn.functional.gelu(self.up(self.norm(x)))))


class _ChannelNormBlock(nn.Module):
    """Batch norm over the channels of a transposed input, as time-series models have it."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = self.norm(x.transpose(1, 2)).transpose(1, 2)
        return x + self.down(torch.nn.functional.gelu(self.up(normed)))


def _model(device: torch.device) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), *(_Block(32) for _ in range(6)), nn.Linear(32, 4))
    return model.to(device).train(), torch.randn(4, 16, 8).to(device)


def _step(model: nn.Module, x: torch.Tensor, backend: Accelerator) -> list[torch.Tensor]:
    backend.manual_seed(1)
    loss = model(x).square().mean()
    loss.backward()
    backend.mark_step()
    found = [loss.detach().cpu(), *(p.grad.detach().cpu() for p in model.parameters())]
    model.zero_grad(set_to_none=True)
    return found


def _saved(model: nn.Module, x: torch.Tensor) -> int:
    with SavedTensorMeter(exclude=model.parameters()) as meter:
        out = model(x)
    del out
    return meter.bytes


@pytest.mark.parametrize("budget", [0.5, 0.25])
def test_a_plan_made_on_the_device_is_exact_and_fits(
    accel_backend: Accelerator, budget: float
) -> None:
    model, x = _model(accel_backend.device())
    plan = plan_checkpointing(model, (x,), budget, backend=accel_backend)
    if fake_profile_unavailable() is None:  # torch 2.5 and later
        assert "real tensors" not in plan.note, plan.note  # fake tensors: nothing ran there
    assert plan.decisions and plan.estimated_bytes <= plan.budget_bytes
    planned = copy.deepcopy(model)
    plan.apply(planned, backend=accel_backend)
    for mine, theirs in zip(
        _step(planned, x, accel_backend), _step(model, x, accel_backend), strict=True
    ):
        assert torch.equal(mine, theirs)
    assert _saved(planned, x) <= (budget + 0.02) * _saved(model, x)


def test_a_plan_saved_on_the_device_loads_and_applies_alike(
    accel_backend: Accelerator, tmp_path: object
) -> None:
    model, x = _model(accel_backend.device())
    plan = plan_checkpointing(model, (x,), 0.5, backend=accel_backend)
    path = f"{tmp_path}/plan.json"
    plan.save(path)
    loaded = CheckpointPlan.load(path)
    assert loaded.to_dict() == plan.to_dict()
    planned = copy.deepcopy(model)
    loaded.apply(planned, example_inputs=(x,), backend=accel_backend)
    for mine, theirs in zip(
        _step(planned, x, accel_backend), _step(model, x, accel_backend), strict=True
    ):
        assert torch.equal(mine, theirs)


def test_a_step_recorded_on_the_device_plans_at_other_rates_as_from_scratch(
    accel_backend: Accelerator,
) -> None:
    model, x = _model(accel_backend.device())
    profile = profile_step(model, (x,), backend=accel_backend)
    rates = builtin_rates(accel_backend.device_type)
    slower = dataclasses.replace(rates, memory_bytes=rates.memory_bytes / 20)
    for each in (rates, slower):
        again = plan_checkpointing(
            model, (x,), 0.5, backend=accel_backend, rates=each, profile=profile
        )
        fresh = plan_checkpointing(model, (x,), 0.5, backend=accel_backend, rates=each)
        assert again.to_dict() == fresh.to_dict()


def test_a_batch_norm_model_planned_on_the_device_trains_exactly(
    accel_backend: Accelerator,
) -> None:
    # The device's batch norm may lay its output out otherwise than the fake kernel:
    # the plan holds, or the first call finds it does not and checkpoints whole (with a
    # warning); either way each step equals the plain model's.
    torch.manual_seed(0)
    model = nn.Sequential(*(_ChannelNormBlock(16) for _ in range(3)), nn.Linear(16, 1))
    model = model.to(accel_backend.device()).train()
    x = torch.randn(4, 6, 16).to(accel_backend.device())
    plan = plan_checkpointing(model, (x,), 0.5, backend=accel_backend)
    planned = copy.deepcopy(model)
    plan.apply(planned, backend=accel_backend)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="checkpointing: .* fake-tensor step")
        for _ in range(2):
            for mine, theirs in zip(
                _step(planned, x, accel_backend), _step(model, x, accel_backend), strict=True
            ):
                assert torch.equal(mine, theirs)


class _Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.rnn = nn.GRU(16, 16, num_layers=2, dropout=0.3, batch_first=True)
        self.head = nn.Linear(16, 50)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.embed(ids))[0])


def test_a_gru_planned_on_the_device_trains_exactly(accel_backend: Accelerator) -> None:
    # nn.GRU as the backend has it: a backend may put its own in place of torch's (a
    # scan-based GRU that runs a backward of its own in forward, to trace its step).
    # An RNN is profiled on real tensors, which must keep what that backward needs.
    torch.manual_seed(0)
    model = _Recurrent().to(accel_backend.device()).train()
    ids = torch.randint(50, (3, 12), generator=torch.Generator().manual_seed(1))
    ids = ids.to(accel_backend.device())
    plan = plan_checkpointing(model, (ids,), 0.5, backend=accel_backend)
    assert "real tensors" in plan.note and "rnn" in plan.decisions
    planned = copy.deepcopy(model)
    plan.apply(planned, backend=accel_backend)
    for mine, theirs in zip(
        _step(planned, ids, accel_backend), _step(model, ids, accel_backend), strict=True
    ):
        assert torch.equal(mine, theirs)
