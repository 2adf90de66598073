"""What the saved-tensor grain reaches: batch norm in training, masks checked once a layout."""

from __future__ import annotations

import copy

import pytest
import torch
from _same_steps import assert_same_steps, step  # loaded by tests/conftest.py
from torch import nn

import accel
from checkpointing._packed import Packed
from checkpointing._replay import replay_arguments
from checkpointing._saved_plan import PACK
from checkpointing._saved_wrapper import SavedTensorWrapper
from checkpointing.planner import builtin_rates, cost
from checkpointing.planner._profile import profile_step
from checkpointing.planner._records import StepProfile
from checkpointing.planner._saved_grain import _Module, saved_plan, saved_units

WIDTH, SEQ, BATCH = 16, 8, 2


def _profile(model: nn.Module, *inputs: torch.Tensor) -> StepProfile:
    return cost(profile_step(model, inputs, accel.get_backend("cpu")), builtin_rates("cpu"))


# -- batch norm ----------------------------------------------------------------------


class _ConvBlock(nn.Module):
    def __init__(self, channels: int = 4) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(hidden)))


def test_batch_norm_in_training_replays_without_the_running_statistics() -> None:
    norm = torch.ops.aten.native_batch_norm.default
    x, weight, bias = torch.randn(2, 3, 4), torch.randn(3), torch.randn(3)
    mean, var = torch.zeros(3), torch.ones(3)
    training = (x, weight, bias, mean, var, True, 0.1, 1e-5)
    replay = replay_arguments(norm, training, {})
    assert replay is not None
    args, _ = replay
    assert args[3] is None and args[4] is None and args[5] is True
    before = mean.clone()
    assert torch.equal(norm(*training)[0], norm(*args)[0])
    assert torch.equal(mean, torch.zeros(3)) is False and torch.equal(before, torch.zeros(3))
    evaluation = (x, weight, bias, mean, var, False, 0.1, 1e-5)
    assert replay_arguments(norm, evaluation, {}) == (evaluation, {})
    assert replay_arguments(torch.ops.aten.bernoulli_.float, (x, 0.5), {}) is None


def test_a_relu_after_batch_norm_is_dropped_and_recomputed_exactly() -> None:
    torch.manual_seed(0)
    reference = nn.Sequential(_ConvBlock(), _ConvBlock()).train()
    x = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(1))
    profile = _profile(reference, x)
    # At these shapes the greedy order drops the convolutions' outputs first; the ReLU's
    # unit is built on its own here.
    block = _Module(profile, profile.modules["0"])
    relus = [
        i
        for i in sorted(block.owned)
        if i in block.producer and block.producer[i].name == "aten.relu.default"
    ]
    assert relus, "the block owns its first ReLU's output"
    unit = block.drop_unit(relus[0])
    assert unit is not None, "the ReLU's output is one batch norm and a ReLU away"
    assert [call.name for call in unit.steps] == [
        "aten.native_batch_norm.default",
        "aten.relu.default",
    ]
    model = copy.deepcopy(reference)
    model[0] = SavedTensorWrapper(model[0], saved_plan(profile, "0", [unit]))
    # Gradients and the running statistics: updated once a step, as without the plan.
    assert_same_steps(model, reference, x)


# -- dropout masks, checked on a layout's first call -----------------------------------


class _Dropped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.dropout(torch.tanh(self.linear(x)), 0.3, training=True)


class _Noised(nn.Module):
    """A random float tensor saved for backward that is no mask: noise in [1, 2)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.linear(x)
        return hidden * torch.empty_like(hidden).uniform_(1.0, 2.0)


def _packing(module: nn.Module) -> tuple[nn.Module, nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    reference = nn.Sequential(module).train()
    x = torch.randn(BATCH, SEQ, WIDTH, generator=torch.Generator().manual_seed(1))
    profile = _profile(reference, x)
    units = [u for u in saved_units(profile, "0")[-1] if u.action == PACK]
    assert units, "the random float tensor is taken for a mask by the planner"
    model = copy.deepcopy(reference)
    model[0] = SavedTensorWrapper(model[0], saved_plan(profile, "0", units))
    return model, reference, x


def test_masks_are_packed_unchecked_after_the_checked_first_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, reference, x = _packing(_Dropped())
    checks: list[bool] = []
    real = Packed.of

    def recorded(tensor: torch.Tensor, check: bool = True) -> Packed | None:
        checks.append(check)
        return real(tensor, check)

    monkeypatch.setattr(Packed, "of", staticmethod(recorded))
    assert_same_steps(model, reference, x)
    assert checks == [True, False, False]


def test_a_random_tensor_that_is_no_mask_checkpoints_the_call_whole() -> None:
    model, reference, x = _packing(_Noised())
    with pytest.warns(UserWarning, match=r"saved tensor \d+ is not a dropout mask of two"):
        step(model, x)
    step(reference, x)
    assert_same_steps(model, reference, x)  # warned once, on the checked call


def test_an_unchecked_pack_trusts_the_checked_call() -> None:
    noise = torch.empty(4, 8).uniform_(1.0, 2.0)
    assert Packed.of(noise) is None
    assert Packed.of(noise, check=False) is not None  # why a checked call must come first
    assert Packed.of(noise * 0.25, check=False) is None  # the scale is still checked
