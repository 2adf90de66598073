"""Nothing is lost when forward or backward raises half-way.

A layer raises once, in forward or in backward. Afterwards every parameter holds its
value in host memory, every gradient is in host memory (as the plain model would have
it: contributions that were fully accumulated before the failure stay), the state is
IDLE, and the next steps give exactly what a model that never failed gives.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

from checkpointing import checkpoint
from offload import Engine, OffloadModel, State, offload_parameters


class Boom(RuntimeError):
    pass


class FailOnCall(nn.Module):
    """Identity that raises on its ``fail_on``-th forward call (counting recomputations)."""

    def __init__(self, fail_on: int) -> None:
        super().__init__()
        self.fail_on = fail_on
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == self.fail_on:
            raise Boom(f"forward call {self.calls}")
        return x


class _RaiseInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, owner: FailInBackward) -> torch.Tensor:
        ctx.owner = owner
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        if ctx.owner.armed:
            ctx.owner.armed = False
            raise Boom("backward")
        return grad, None


class FailInBackward(nn.Module):
    """Identity whose backward raises once after ``armed`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _RaiseInBackward.apply(x, self)


def layers(fault: nn.Module) -> list[nn.Module]:
    torch.manual_seed(0)
    return [
        nn.Linear(4, 8),
        nn.ReLU(),
        nn.Linear(8, 8),
        fault,
        nn.Tanh(),
        nn.Linear(8, 8),
        nn.Linear(8, 2),
    ]


def snapshot(model: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    return [
        (p.detach().clone(), None if p.grad is None else p.grad.clone()) for p in model.parameters()
    ]


def step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor) -> None:
    model(x).square().sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def assert_home(model: nn.Module) -> None:
    for p in model.parameters():
        assert p.device.type == "cpu"
        assert p.grad is None or p.grad.device.type == "cpu"


def slice_of_parameters(model: OffloadModel) -> list[int]:
    return [
        index
        for index, (start, stop) in enumerate(model.slices)
        for layer in range(start, stop)
        for _ in model.module[layer].parameters()
    ]


@pytest.mark.parametrize("num_microbatches", [1, 2], ids=["mb1", "mb2"])
@pytest.mark.parametrize("checkpoint_activation", [False, True], ids=["plain", "ckpt"])
def test_offload_model_survives_a_failing_layer(
    copy_mode: bool, checkpoint_activation: bool, num_microbatches: int
) -> None:
    # The layer runs once per micro-batch. Without checkpointing its call 2 * mb is the
    # last micro-batch of the second step's forward; with checkpointing it is the last
    # micro-batch's recomputation inside the first step's backward.
    fault = FailOnCall(fail_on=2 * num_microbatches)
    model = OffloadModel(
        layers(fault),
        num_slices=3,
        checkpoint_activation=checkpoint_activation,
        num_microbatches=num_microbatches,
    )
    reference = nn.Sequential(*layers(nn.Identity()))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    x = torch.randn(4, 4)
    if not checkpoint_activation:
        step(model, optimizer, x)
        step(reference, reference_optimizer, x)
    for p in model.parameters():  # an accumulated gradient must survive the failure
        p.grad = torch.ones_like(p)
    before = snapshot(model)
    with pytest.raises(Boom):
        model(x).square().sum().backward()
    assert model.state is State.IDLE and model.is_home() and model.resident_slices == ()
    assert_home(model)
    failing = next(i for i, (a, b) in enumerate(model.slices) if a <= 3 < b)
    for (value, grad), p, index in zip(
        before, model.parameters(), slice_of_parameters(model), strict=True
    ):
        assert torch.equal(p, value)
        assert p.grad is not None and grad is not None
        if index <= failing:  # never reached by a finished backward
            assert torch.equal(p.grad, grad)
    model.zero_grad(set_to_none=True)
    for _ in range(2):
        x = torch.randn(4, 4)
        step(model, optimizer, x)
        step(reference, reference_optimizer, x)
    for mine, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        if num_microbatches > 1:  # summed per micro-batch: reduction order differs
            torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)
        else:
            assert torch.equal(mine, theirs)


@pytest.mark.parametrize("checkpoint_activation", [False, True], ids=["plain", "ckpt"])
def test_offload_model_survives_a_failing_backward(
    copy_mode: bool, checkpoint_activation: bool
) -> None:
    fault = FailInBackward()
    model = OffloadModel(layers(fault), num_slices=3, checkpoint_activation=checkpoint_activation)
    reference = nn.Sequential(*layers(nn.Identity()))
    x = torch.randn(4, 4)
    model(x).sum().backward()  # gradients to keep
    reference(x).sum().backward()
    before = snapshot(model)
    fault.armed = True
    with pytest.raises(Boom, match="backward"):
        model(x).square().sum().backward()
    assert model.state is State.IDLE and model.is_home()
    assert_home(model)
    # The slices before the failing one (in backward order) finished: their gradients
    # grew, as the plain model's would; the failing slice and those after kept theirs.
    first_failing = next(i for i, (a, b) in enumerate(model.slices) if a <= 3 < b)
    params = list(model.parameters())
    for (value, grad), p, index in zip(before, params, slice_of_parameters(model), strict=True):
        assert torch.equal(p, value)
        assert grad is not None and p.grad is not None
        assert torch.equal(p.grad, grad) == (index <= first_failing)
    model.zero_grad()
    reference.zero_grad()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    reference_optimizer = torch.optim.Adam(reference.parameters(), lr=0.01)
    for _ in range(2):
        step(model, optimizer, x)
        step(reference, reference_optimizer, x)
    for mine, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(mine, theirs)


class Net(nn.Module):
    def __init__(self, fault: nn.Module, checkpointed: bool) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.checkpointed = checkpointed
        self.a = nn.Linear(4, 8)
        self.b = nn.Linear(8, 8)
        self.fault = fault
        self.c = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        inner = nn.Sequential(self.b, self.fault)
        h = checkpoint(inner, h, use_reentrant=True) if self.checkpointed else inner(h)
        return self.c(h + torch.relu(self.a(x)))


@pytest.mark.parametrize("through_engine", [False, True], ids=["backward", "engine"])
@pytest.mark.parametrize("checkpointed", [False, True], ids=["eager", "reentrant-ckpt"])
@pytest.mark.parametrize("where", ["forward", "backward"])
def test_parameter_offload_survives_failures(
    copy_mode: bool, where: str, checkpointed: bool, through_engine: bool
) -> None:
    fault: nn.Module = FailOnCall(fail_on=2) if where == "forward" else FailInBackward()
    model = Net(fault, checkpointed)
    reference = Net(nn.Identity(), checkpointed)
    handle = offload_parameters(model, prefetch=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    engine = Engine(model, optimizer)
    x = torch.randn(3, 4)
    if where == "forward" and not checkpointed:
        step(model, optimizer, x)  # the failing call is the next forward
        step(reference, torch.optim.SGD(reference.parameters(), lr=0.1), x)
    if isinstance(fault, FailInBackward):
        fault.armed = True
    before = snapshot(model)
    with pytest.raises(Boom):
        loss = model(x).square().sum()
        if through_engine:
            engine.backward(loss)
        else:
            loss.backward()
    if not through_engine:
        handle.recover()  # autograd runs no callback after a failure; the engine recovers
    assert handle.state is State.IDLE and handle.is_home()
    assert_home(model)
    for (value, _), p in zip(before, model.parameters(), strict=True):
        assert torch.equal(p, value)
    model.zero_grad()
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(2):
        step(model, optimizer, x)
        step(reference, reference_optimizer, x)
    for mine, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(mine, theirs)
    handle.remove()


def test_the_next_forward_recovers_by_itself(copy_mode: bool) -> None:
    fault = FailInBackward()
    model = Net(fault, checkpointed=False)
    reference = copy.deepcopy(model)
    reference.fault = nn.Identity()
    handle = offload_parameters(model)
    fault.armed = True
    x = torch.randn(3, 4)
    with pytest.raises(Boom):
        model(x).sum().backward()
    assert handle.state is not State.IDLE  # nobody recovered yet
    model.zero_grad()
    model(x).sum().backward()  # the root's forward pre-hook recovers first
    reference(x).sum().backward()
    assert handle.state is State.IDLE and handle.is_home()
    for mine, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        assert mine.grad is not None and theirs.grad is not None
        assert torch.equal(mine.grad, theirs.grad)
