"""Engine in a real loop: clipping, schedulers, forced boundaries, scaler state, sparse grads.

Parity with the plain loop is bit-exact: the loss scales are powers of two, so unscaled
gradients are those of the unscaled loss, and clipping sees the same gradients.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from offload import (
    Engine,
    LossScaler,
    OffloadConfigError,
    OffloadError,
    OffloadModel,
    offload_parameters,
)

pytestmark = pytest.mark.usefixtures("copies")


def make(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))


def batch(index: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(index)
    return torch.randn(6, 5, generator=generator) * 4, torch.randn(6, 2, generator=generator)


def schedule(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))


WRAPPERS: dict[str, Callable[[nn.Sequential], nn.Module]] = {
    "plain": lambda model: model,
    "offload-model": lambda model: OffloadModel(model, num_slices=3),
    "offload-parameters": lambda model: (offload_parameters(model), model)[1],
}


@pytest.mark.parametrize("wrapper", list(WRAPPERS))
def test_clipping_and_scheduler_match_the_plain_loop(wrapper: str) -> None:
    accumulation, steps, max_norm = 2, 3, 0.05
    plain = make()
    optimizer = torch.optim.SGD(plain.parameters(), lr=0.5)
    scheduler = schedule(optimizer)
    norms = []
    for index in range(steps * accumulation):
        x, y = batch(index)
        (nn.functional.mse_loss(plain(x), y) / accumulation).backward()
        if (index + 1) % accumulation == 0:
            norms.append(float(torch.nn.utils.clip_grad_norm_(plain.parameters(), max_norm)))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()

    model = WRAPPERS[wrapper](make())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    engine = Engine(
        model,
        optimizer,
        gradient_accumulation_steps=accumulation,
        loss_scale="dynamic",
        gradient_clipping=max_norm,
        lr_scheduler=schedule(optimizer),
    )
    seen = []
    for index in range(steps * accumulation):
        x, y = batch(index)
        engine.backward(nn.functional.mse_loss(engine(x), y))
        if engine.step():
            seen.append(engine.grad_norm)
    assert seen == norms and min(norms) > max_norm  # every step was clipped
    assert engine.lr_scheduler.last_epoch == steps
    for actual, expected in zip(model.parameters(), plain.parameters(), strict=True):
        assert torch.equal(actual, expected)


def test_a_boundary_can_be_forced() -> None:
    model = make()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    engine = Engine(model, optimizer, gradient_accumulation_steps=3)
    stepped = []
    for index in range(5):
        if index == 1:
            engine.set_gradient_accumulation_boundary()
        x, y = batch(index)
        engine.backward(nn.functional.mse_loss(engine(x), y))
        stepped.append(engine.step())
    # Forced at the second call; the count of three starts again after it.
    assert stepped == [False, True, False, False, True]
    assert engine.global_steps == 2 and engine.micro_steps == 5


def test_step_without_backward_is_refused() -> None:
    model = make()
    engine = Engine(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(OffloadError, match=r"^offload: Engine\.step\(\) was called without"):
        engine.step()
    x, y = batch(0)
    engine.backward(nn.functional.mse_loss(engine(x), y))
    assert engine.step() is True
    with pytest.raises(OffloadError, match=r"call engine\.backward"):
        engine.step()
    assert engine.global_steps == 1 and engine.micro_steps == 1


def test_engine_arguments_are_checked() -> None:
    model = make()
    with pytest.raises(OffloadConfigError, match="gradient_clipping must be a number >= 0"):
        Engine(model, gradient_clipping=-1.0)
    with pytest.raises(OffloadConfigError, match="lr_scheduler must have a step"):
        Engine(model, lr_scheduler=object())
    assert Engine(model, gradient_clipping=0).gradient_clipping is None
    assert Engine(model, backend="cpu").backend.name == "cpu"


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"scale": float("nan"), "clean_steps": 0}, "scale=nan"),
        ({"scale": -2.0, "clean_steps": 0}, "positive finite"),
        ({"clean_steps": 0}, "lacks 'scale'"),
        ({"scale": "big", "clean_steps": 0}, "not a number"),
    ],
)
def test_scaler_state_is_checked_before_it_is_loaded(state: dict[str, Any], message: str) -> None:
    scaler = LossScaler(256.0)
    before = scaler.state_dict()
    with pytest.raises(OffloadConfigError, match=message):
        scaler.load_state_dict(state)
    assert scaler.state_dict() == before
    restored = LossScaler()
    restored.load_state_dict(before)
    assert restored.state_dict() == before


def test_hysteresis_tolerates_overflows_before_backing_off() -> None:
    scaler = LossScaler(64.0, hysteresis=2)
    scaler.update(found_inf=True)
    assert scaler.scale == 64.0
    scaler.update(found_inf=True)
    assert scaler.scale == 32.0
    scaler.update(found_inf=True)
    assert scaler.scale == 32.0
    with pytest.raises(OffloadConfigError, match="hysteresis >= 1"):
        LossScaler(hysteresis=0)


def test_sparse_gradients_are_unscaled() -> None:
    def run(engine_scaled: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        embedding = nn.Embedding(10, 4, sparse=True)
        optimizer = torch.optim.SparseAdam(embedding.parameters(), lr=0.1)
        engine = Engine(embedding, optimizer, loss_scale="dynamic" if engine_scaled else None)
        for index in range(3):
            tokens = torch.randint(0, 10, (6,), generator=torch.Generator().manual_seed(index))
            engine.backward(engine(tokens).square().sum())
            assert engine.step()
        return [embedding.weight.detach()]

    assert torch.equal(run(True)[0], run(False)[0])
