"""Engine: accumulation boundaries, loss division, loss scaling, mark_step, errors.

Parity is bit-exact: the engine divides the loss exactly as ``(loss / steps).backward()``
does, and the default loss scales are powers of two, which scale and unscale float32
gradients without rounding.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable

import pytest
import torch
from torch import nn

from accel.testing import RecordingBackend
from offload import (
    Engine,
    LossScaler,
    OffloadConfigError,
    OffloadModel,
    State,
    offload_parameters,
)

pytestmark = pytest.mark.usefixtures("copies")


def make(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))


def batches(count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(42)
    return [
        (torch.randn(6, 5, generator=generator), torch.randn(6, 2, generator=generator))
        for _ in range(count)
    ]


def plain_training(steps: int, accumulation: int) -> list[torch.Tensor]:
    model = make()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for index, (x, y) in enumerate(batches(steps * accumulation)):
        loss = nn.functional.mse_loss(model(x), y)
        (loss / accumulation).backward()
        if (index + 1) % accumulation == 0:
            optimizer.step()
            optimizer.zero_grad()
    return [p.detach() for p in model.parameters()]


WRAPPERS: dict[str, Callable[[nn.Sequential], nn.Module]] = {
    "plain": lambda model: model,
    "offload-model": lambda model: OffloadModel(model, num_slices=3, checkpoint_activation=True),
    "offload-parameters": lambda model: (offload_parameters(model), model)[1],
}


@pytest.mark.parametrize("loss_scale", [None, "dynamic", 1024.0])
@pytest.mark.parametrize("wrapper", list(WRAPPERS))
def test_accumulation_matches_plain_training(wrapper: str, loss_scale: float | str | None) -> None:
    accumulation, steps = 3, 3
    model = WRAPPERS[wrapper](make())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    engine = Engine(
        model, optimizer, gradient_accumulation_steps=accumulation, loss_scale=loss_scale
    )
    boundaries, stepped = [], []
    for x, y in batches(steps * accumulation):
        loss = nn.functional.mse_loss(engine(x), y)
        boundaries.append(engine.is_gradient_accumulation_boundary())
        returned = engine.backward(loss)
        assert torch.equal(returned, loss / accumulation)
        stepped.append(engine.step())
    assert boundaries == [False, False, True] * steps
    assert stepped == boundaries
    assert engine.global_steps == steps and engine.micro_steps == steps * accumulation
    for mine, expected in zip(model.parameters(), plain_training(steps, accumulation), strict=True):
        assert torch.equal(mine, expected)
        assert mine.grad is None  # zeroed at the boundary
    if isinstance(model, OffloadModel):
        assert model.state is State.IDLE and model.is_home()


def test_scale_wrt_gas_false_keeps_the_loss() -> None:
    model = make()
    engine = Engine(
        model, torch.optim.SGD(model.parameters(), lr=0.1), gradient_accumulation_steps=4
    )
    x, y = batches(1)[0]
    loss = nn.functional.mse_loss(engine(x), y)
    assert engine.backward(loss, scale_wrt_gas=False) is loss
    reference = make()
    nn.functional.mse_loss(reference(x), y).backward()
    for mine, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        assert mine.grad is not None and theirs.grad is not None
        assert torch.equal(mine.grad, theirs.grad)


def test_mark_step_after_backward_and_after_the_optimizer_step() -> None:
    backend = RecordingBackend()
    model = make()
    engine = Engine(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        gradient_accumulation_steps=2,
        backend=backend,
    )
    hook_calls: list[int] = []
    model[0].weight.register_hook(lambda grad: hook_calls.append(len(backend.calls)))
    (x, y), (x2, y2) = batches(2)
    engine.backward(nn.functional.mse_loss(engine(x), y))
    assert backend.call_names() == ["mark_step"] and hook_calls == [0]
    backend.clear()
    assert engine.step() is False
    assert backend.call_names() == []  # between boundaries nothing happens
    engine.backward(nn.functional.mse_loss(engine(x2), y2))
    backend.clear()
    step_calls: list[str] = []
    original_step = engine.optimizer.step  # type: ignore[union-attr]

    def spy_step(*args: object, **kwargs: object) -> None:
        step_calls.extend(backend.call_names())
        original_step()

    engine.optimizer.step = spy_step  # type: ignore[method-assign,union-attr]
    assert engine.step() is True
    # The host waits for the device before reading gradients, then flushes after the step.
    assert step_calls == ["synchronize"]
    assert backend.call_names() == ["synchronize", "mark_step"]


def test_overflow_skips_the_step_and_backs_off(caplog: pytest.LogCaptureFixture) -> None:
    model = OffloadModel(make(), num_slices=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # 2**140 overflows float32 (max ~2**128): the scaled gradients are inf.
    engine = Engine(model, optimizer, loss_scale=LossScaler(2.0**140, growth_interval=2))
    before = [p.detach().clone() for p in model.parameters()]
    x, y = batches(1)[0]
    results = []
    with caplog.at_level(logging.WARNING, logger="offload"):
        for _ in range(14):
            engine.backward(nn.functional.mse_loss(engine(x), y))
            results.append(engine.step())
            if results[-1]:
                break
    skipped = len(results) - 1
    assert results == [False] * skipped + [True] and skipped >= 12
    assert engine.skipped_steps == skipped
    assert engine.loss_scale == 2.0 ** (140 - skipped)
    assert sum("skipped optimizer step" in r.message for r in caplog.records) == skipped
    assert all(p.grad is None for p in model.parameters())  # zeroed, also when skipped
    changed = [not torch.equal(a, b) for a, b in zip(model.parameters(), before, strict=True)]
    assert all(changed)  # only the last, clean step changed the weights


def test_nan_gradients_skip_the_step_under_static_scaling() -> None:
    class Poison(nn.Module):
        poison = True

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * float("nan") if self.poison else x

    poison = Poison()
    model = OffloadModel([nn.Linear(5, 2), poison], num_slices=2)
    engine = Engine(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_scale=8.0)
    before = [p.detach().clone() for p in model.parameters()]
    x, _ = batches(1)[0]
    engine.backward(engine(x).sum())
    assert engine.step() is False and engine.loss_scale == 8.0
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before, strict=True))
    poison.poison = False
    engine.backward(engine(x).sum())
    assert engine.step() is True


def test_dynamic_scale_grows_after_clean_steps() -> None:
    scaler = LossScaler(4.0, growth_interval=2)
    for found_inf, expected in [
        (False, 4.0),
        (False, 8.0),
        (True, 4.0),
        (False, 4.0),
        (False, 8.0),
    ]:
        scaler.update(found_inf)
        assert scaler.scale == expected
    state = scaler.state_dict()
    other = LossScaler()
    other.load_state_dict(state)
    assert other.scale == 8.0
    static = LossScaler(3.0, dynamic=False)
    static.update(True)
    assert static.scale == 3.0


def test_errors_are_clear() -> None:
    model = make()
    engine = Engine(model)
    x, y = batches(1)[0]
    with pytest.raises(OffloadConfigError, match="needs an optimizer"):
        engine.backward(nn.functional.mse_loss(engine(x), y))
    engine = Engine(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(OffloadConfigError, match=r"needs a scalar loss, got .* shape \(6, 2\)"):
        engine.backward(engine(x))
    with pytest.raises(OffloadConfigError, match="needs the loss as a tensor, got float"):
        engine.backward(1.0)  # type: ignore[arg-type]
    with pytest.raises(OffloadConfigError, match="does not require grad"):
        engine.backward(torch.tensor(1.0))
    with pytest.raises(OffloadConfigError, match="gradient_accumulation_steps must be"):
        Engine(model, gradient_accumulation_steps=0)
    with pytest.raises(OffloadConfigError, match="loss_scale must be"):
        Engine(model, loss_scale="static")
    with pytest.raises(OffloadConfigError, match="positive finite"):
        LossScaler(float("inf"))
    assert engine.micro_steps == 0  # nothing counted


def test_an_optimizer_of_another_model_is_refused() -> None:
    model, other = nn.Linear(4, 2), nn.Linear(4, 2)
    optimizer = torch.optim.SGD(other.parameters(), lr=0.1)
    state = copy.deepcopy(optimizer.state_dict())
    with pytest.raises(OffloadConfigError, match=r"holds none of the model's 2 parameters"):
        Engine(model, optimizer)
    assert optimizer.state_dict() == state and model.weight.grad is None
    partial = torch.optim.SGD([model.weight], lr=0.1)  # some of them: fine-tuning
    assert Engine(model, partial).optimizer is partial
