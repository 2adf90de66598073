"""The memory budget on module shapes without children, and why a budget cannot be reached.

Leaves that do their own work (``nn.LSTM``, ``nn.GRU``, a GRU whose forward runs a
backward of its own, a user's childless layer), self-attention called as
``attn(x, x, x)``, and a model that is one childless module (checkpointed whole through
its forward) are planned, bit-exact with dropout; every "cannot reach" error names its
cause.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

# torch's own GRU: a backend may put another in place of nn.GRU where it is imported
# (torch_xla 2.9 puts a scan-based GRU there, which runs on XLA tensors only), and the
# models here live on the host.
from torch.nn.modules.rnn import GRU

import checkpointing
from checkpointing import CheckpointPlan, Decision, plan_checkpointing
from checkpointing._decisions import FULL


def _step(model: nn.Module, inputs: tuple[Any, ...]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    torch.manual_seed(7)
    out = model(*inputs)
    out = out[0] if isinstance(out, tuple) else out
    out.square().mean().backward()
    grads = [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
    model.zero_grad(set_to_none=True)
    return out.detach(), grads


def _assert_same_step(model: nn.Module, reference: nn.Module, inputs: tuple[Any, ...]) -> None:
    out, grads = _step(model, inputs)
    expected_out, expected_grads = _step(reference, inputs)
    assert torch.equal(out, expected_out)
    assert all(torch.equal(a, b) for a, b in zip(grads, expected_grads, strict=True))


class Recurrent(nn.Module):
    """Embedding, a 2-layer RNN with dropout between its layers, a head."""

    def __init__(self, kind: type[nn.RNNBase]) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.rnn = kind(16, 16, num_layers=2, dropout=0.3, batch_first=True)
        self.head = nn.Linear(16, 50)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.embed(ids))[0])


class GradientInForwardGRU(GRU):
    """A GRU whose forward runs a backward of its own first, as a scan-based GRU does.

    Such a GRU (what a backend may put in place of ``nn.GRU``) traces its step with
    AOTAutograd and runs the trace's backward to capture it, inside its forward. As an
    ``nn.RNNBase`` it is profiled on real tensors, which once kept none of what autograd
    saved and so refused that backward.
    """

    def forward(self, input: Any, hx: Any = None) -> Any:
        probe = torch.ones(4, requires_grad=True)
        (grad,) = torch.autograd.grad((probe.sin() * probe).sum(), probe)
        assert torch.equal(grad, probe.cos() * probe + probe.sin())
        return super().forward(input, hx)


class Mixer(nn.Module):
    """A user's own layer without children: parameters and functional operators."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.up = nn.Parameter(torch.randn(4 * width, width) / width**0.5)
        self.down = nn.Parameter(torch.randn(width, 4 * width) / (2 * width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = nn.functional.gelu(nn.functional.linear(x, self.up))
        hidden = nn.functional.dropout(hidden, 0.2, self.training)
        return x + nn.functional.linear(hidden, self.down)


class SelfAttention(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, 2, dropout=0.2, batch_first=True)
        self.head = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = self.norm(x)
        attended, _ = self.attention(normed, normed, normed, need_weights=False)
        return self.head(x + attended)


def _ids() -> torch.Tensor:
    return torch.randint(50, (3, 12), generator=torch.Generator().manual_seed(1))


def _x() -> torch.Tensor:
    return torch.randn(3, 12, 16, generator=torch.Generator().manual_seed(1))


def _built(factory: Any) -> nn.Module:
    torch.manual_seed(0)
    module: nn.Module = factory()
    return module.train()


CASES = {
    "lstm": (lambda: Recurrent(nn.LSTM), _ids, "rnn"),
    "gru": (lambda: Recurrent(GRU), _ids, "rnn"),
    "gru taking gradients in forward": (lambda: Recurrent(GradientInForwardGRU), _ids, "rnn"),
    "childless model": (Mixer, _x, ""),
    "self-attention": (SelfAttention, _x, "attention"),
}


@pytest.mark.parametrize("budget", [0.5, 0.25])
@pytest.mark.parametrize("case", list(CASES))
def test_modules_without_children_are_planned_exactly(case: str, budget: float) -> None:
    factory, inputs, module = CASES[case]
    model, plain, example = _built(factory), _built(factory), (inputs(),)
    plan = plan_checkpointing(model, example, budget)
    assert module in plan.decisions
    assert plan.estimated_bytes <= plan.budget_bytes
    plan.apply(model)
    _assert_same_step(model, plain, example)
    copied = copy.deepcopy(model)  # a checkpointed root is copied with its model
    _assert_same_step(copied, plain, example)


def test_rnn_is_checkpointed_whole_only() -> None:
    model = _built(lambda: Recurrent(nn.LSTM))
    plan = plan_checkpointing(model, (_ids(),), 0.25)
    assert plan.decisions == {"rnn": FULL}


class GradientAcrossModules(nn.Module):
    """An LSTM (so profiled on real tensors), and in forward a gradient through the head."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(16, 16, batch_first=True)
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        energy = self.head(self.rnn(x)[0]).sum()
        (force,) = torch.autograd.grad(energy, x, create_graph=True)
        return force


def test_a_gradient_through_an_earlier_call_in_a_real_profile_is_refused_plainly() -> None:
    # The real-tensor profile keeps what a module call saved until it returns: the
    # head's input is gone when the model's own forward takes its gradient.
    x = _x().requires_grad_()
    with pytest.raises(RuntimeError, match=r"^checkpointing: the model's forward ran a backward"):
        plan_checkpointing(_built(GradientAcrossModules), (x,), 0.5)


def test_childless_model_is_checkpointed_through_its_forward() -> None:
    model, plain, x = _built(Mixer), _built(Mixer), _x()
    plan = plan_checkpointing(model, (x,), 0.5)
    assert plan.decisions == {"": FULL}
    assert "(the model)" in str(plan)
    assert plan.apply(model) == [""]
    assert list(model.state_dict()) == list(plain.state_dict())
    _assert_same_step(model, plain, (x,))
    with pytest.raises(ValueError, match=r"model itself is already checkpointed whole"):
        plan.apply(model)
    figures: dict[str, Any] = {
        **dict.fromkeys(("plain_bytes", "estimated_bytes", "budget_bytes"), 1),
        **dict.fromkeys(("estimated_step_time_ratio", "step_seconds"), 1.0),
    }
    wrong = CheckpointPlan(choices={"": Decision("recompute cheap ops")}, rows=(), **figures)
    with pytest.raises(ValueError, match=r"root can only be checkpointed whole"):
        wrong.apply(_built(Mixer))


def test_bare_tensor_inputs_are_refused_with_the_tuple_to_pass() -> None:
    model = _built(Mixer)
    with pytest.raises(TypeError, match=r"got a Tensor\. For a model called as model\(x\), "):
        plan_checkpointing(model, _x(), 0.5)
    with pytest.raises(TypeError, match=r"example_inputs=\(x,\)"):
        checkpointing.apply_activation_checkpointing(model, memory_budget=0.5, example_inputs=_x())
    assert "forward" not in model.__dict__


def test_evaluation_mode_is_refused_with_what_to_do() -> None:
    model = _built(Mixer).eval()
    with pytest.raises(ValueError, match=r"evaluation mode .* Call model\.train\(\) before"):
        plan_checkpointing(model, (_x(),), 0.5)
    assert not model.training


class Shared(nn.Module):
    """One layer called twice, and no operator of the model's own saves anything."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Sequential(nn.Linear(16, 16), nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(self.layer(x))


def test_a_module_called_twice_is_planned_call_by_call() -> None:
    model = _built(Shared)
    plan = plan_checkpointing(model, (_x(),), 0.7)
    assert set(plan.decisions) <= {"layer@0", "layer@1"} and plan.decisions
    assert plan.calls == {"layer": 2}
    planned = copy.deepcopy(model)
    plan.apply(planned)
    x = _x()
    planned(x).sum().backward()
    model(x).sum().backward()
    for mine, theirs in zip(planned.parameters(), model.parameters(), strict=True):
        assert mine.grad is not None and torch.equal(mine.grad, theirs.grad)


class _Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Dropout(0.1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(self.inner(x))


class Looped(nn.Module):
    """A block run twice per forward whose inner layer runs twice per block call."""

    def __init__(self) -> None:
        super().__init__()
        self.block = _Twice()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(self.block(x))


def _looped_plan(enclosed: dict[str, dict[str, tuple[int, ...]]]) -> CheckpointPlan:
    """The first block call checkpointed whole, the inner layer's last call alone."""
    plan = plan_checkpointing(_built(Looped), (_x(),), 0.7)
    choices = {"block@0": Decision(FULL, None), "block.inner@3": Decision(FULL, None)}
    calls = {"block": 2, "block.inner": 4}
    return CheckpointPlan(
        **{**plan.__dict__, "choices": choices, "calls": calls, "enclosed": enclosed}
    )


def test_calls_inside_a_planned_call_are_neither_counted_nor_wrapped() -> None:
    plan = _looped_plan({"block@0": {"block.inner": (0, 1)}})
    assert CheckpointPlan.from_dict(plan.to_dict()).enclosed == plan.enclosed
    model = _built(Looped)
    planned = copy.deepcopy(model)
    plan.apply(planned)
    block = planned.block
    assert isinstance(block, checkpointing.PerCallWrapper)
    inner = block.module.inner
    assert isinstance(inner, checkpointing.PerCallWrapper)
    assert len(inner.variants) == 2 and inner.variants[0] is None  # calls 2 and 3
    assert inner.variants[1] is not None
    _assert_same_step(planned, model, (_x(),))
    assert inner.__dict__["_count"] == 2 and inner.__dict__["_inside"] == 0
    assert block.__dict__["_count"] == 2


class Reused(nn.Module):
    """One layer called inside a stage (called once) and again after it."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Dropout(0.1))
        self.stage = nn.Sequential(nn.Linear(16, 16), self.layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(self.stage(x))


def test_a_module_called_once_that_encloses_per_call_calls_marks_them() -> None:
    model = _built(Reused)
    profiled = plan_checkpointing(model, (_x(),), 0.7)
    plan = CheckpointPlan(
        **{
            **profiled.__dict__,
            "choices": {"stage": Decision(FULL, None), "layer@1": Decision(FULL, None)},
            "calls": {"layer": 2},
            "enclosed": {"stage": {"layer": (0,)}},
        }
    )
    planned = copy.deepcopy(model)
    plan.apply(planned)
    stage, layer = planned.stage, planned.layer
    assert isinstance(stage, checkpointing.PerCallWrapper) and len(stage.variants) == 1
    assert isinstance(layer, checkpointing.PerCallWrapper) and len(layer.variants) == 1
    _assert_same_step(planned, model, (_x(),))
    assert layer.__dict__["_count"] == 1 and stage.__dict__["_count"] == 1


@pytest.mark.parametrize(
    ("enclosed", "match"),
    [
        ({"block@0": {"block.inner": (5,)}}, r"encloses calls \[5\] of 'block.inner'"),
        ({"block@1": {"block.inner": (2,)}}, r"'block@1' encloses"),
        ({"block@0": {"block.inner": (3,)}}, r"wraps 'block.inner@3' and also runs it inside"),
    ],
)
def test_enclosed_calls_the_plan_does_not_have_are_refused_before_wrapping(
    enclosed: dict[str, dict[str, tuple[int, ...]]], match: str
) -> None:
    model = _built(Looped)
    with pytest.raises(ValueError, match=match):
        _looped_plan(enclosed).apply(model)
    assert not any(isinstance(m, checkpointing.PerCallWrapper) for m in model.modules())


class Offset(nn.Module):
    """A model whose only operator saves nothing for backward."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Module()
        self.shift = nn.Parameter(torch.zeros(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.shift


def test_nothing_to_checkpoint_is_named_as_the_cause() -> None:
    with pytest.raises(ValueError, match=r"no module of this model can be checkpointed") as error:
        plan_checkpointing(_built(Offset), (_x(),), 0.5)
    assert "save activations for backward" in str(error.value)
    assert "smallest reachable" not in str(error.value)


def test_budget_below_the_floor_gives_the_true_floor() -> None:
    model = _built(lambda: Recurrent(nn.LSTM))
    with pytest.raises(ValueError, match=r"the smallest reachable is") as error:
        plan_checkpointing(model, (_ids(),), 0.001)
    floor = float(str(error.value).split("the smallest reachable is ")[1].split(" ")[0])
    assert 0.001 < floor < 0.5  # the LSTM checkpointed whole, not 1.000
    plan = plan_checkpointing(model, (_ids(),), min(floor + 0.01, 1.0))
    assert plan.estimated_bytes <= plan.budget_bytes
