"""The chosen-calls operator grain: units, their rules, the guard, and exactness."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

import accel
from accel._compat import selective_cache_allows_mutation
from checkpointing import CheckpointError, CheckpointPlan, Decision
from checkpointing._decisions import CHOSEN
from checkpointing._measure import LiveActivationMeter
from checkpointing._selective import _draws, unavailable_reason, written_tensors
from checkpointing._selective_wrapper import SelectiveCheckpointWrapper
from checkpointing.planner import builtin_rates, cost
from checkpointing.planner._kept_ops import Unit, find_units, keep_options
from checkpointing.planner._profile import profile_step
from checkpointing.planner._records import OpCall

NO_SELECTIVE = unavailable_reason()
pytestmark = pytest.mark.skipif(
    NO_SELECTIVE is not None, reason=f"operator-grain checkpointing: {NO_SELECTIVE}"
)
needs_mutable_cache = pytest.mark.skipif(
    not selective_cache_allows_mutation(),
    reason=f"torch {torch.__version__}'s selective cache refuses mutated entries",
)

# A plan's figures do not matter to apply(); only its decisions and kept calls do.
_FIELDS: dict[str, Any] = {
    "rows": (),
    **dict.fromkeys(("plain_bytes", "estimated_bytes", "budget_bytes"), 1),
    **dict.fromkeys(("estimated_step_time_ratio", "step_seconds"), 1.0),
}


class Block(nn.Module):
    """Two dropouts on the host: each is ``empty_like``, ``bernoulli_``, ``div_``, ``mul``."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)
        self.drop = nn.Dropout(0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.drop(torch.relu(self.up(x)))
        return x + self.drop(self.down(hidden))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(Block(), Block()).train()


def _inputs() -> torch.Tensor:
    return torch.randn(6, 16, generator=torch.Generator().manual_seed(1))


def _step(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    torch.manual_seed(5)
    out = model(x)
    out.square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
    model.zero_grad(set_to_none=True)
    return out.detach(), grads


def _live_bytes(model: nn.Module, x: torch.Tensor) -> int:
    with LiveActivationMeter(exclude=list(model.parameters())) as meter:
        out = model(x)
    return meter.bytes - out.untyped_storage().nbytes()  # the graph lives while out does


def _units(model: nn.Module, name: str) -> tuple[list[Unit], Any]:
    recorded = profile_step(model, (_inputs(),), accel.get_backend("cpu"))
    profile = cost(recorded, builtin_rates("cpu"))
    record = profile.modules[name]
    return find_units(record.ops, selective_cache_allows_mutation()), profile


def _kept(units: list[Unit], numbers: list[int]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(call for n in numbers for call in units[n].calls))


def _apply(model: nn.Module, kept: dict[str, tuple[tuple[str, int], ...]]) -> None:
    decisions = {name: Decision(CHOSEN, calls) for name, calls in kept.items()}
    CheckpointPlan(choices=decisions, **_FIELDS).apply(model)


def _call(op: str, n: int = 0, **fields: Any) -> OpCall:
    values: dict[str, Any] = dict(fresh=(), mutated=(), read=(), random=False, seconds=1.0)
    values.update(fields)
    return OpCall(f"aten.{op}.default", n, **values)


def test_host_dropout_is_one_random_unit_of_three_calls() -> None:
    units, _ = _units(_model(), "0")
    draws = [unit for unit in units if unit.random]
    assert len(draws) == 2
    for occurrence, unit in enumerate(draws):
        names = [name.split(".")[1] for name, _ in unit.calls]
        assert names == ["empty_like", "bernoulli_", "div_"]
        assert {n for _, n in unit.calls} == {occurrence}
        assert unit.keepable is selective_cache_allows_mutation()


@needs_mutable_cache
def test_keeping_every_unit_is_bit_exact_with_dropout_and_keeps_less() -> None:
    plain, model, x = _model(), _model(), _inputs()
    units, _ = _units(model, "0")
    keep = [n for n, unit in enumerate(units) if unit.keepable]
    _apply(model, {"0": _kept(units, keep), "1": _kept(units, keep[len(keep) // 2 :])})
    assert isinstance(model[0], SelectiveCheckpointWrapper)
    assert "chosen operator calls kept" in repr(model[0])
    out, grads = _step(model, x)
    expected_out, expected_grads = _step(plain, x)
    assert torch.equal(out, expected_out)
    assert all(torch.equal(a, b) for a, b in zip(grads, expected_grads, strict=True))
    assert 0 < _live_bytes(model, x) < _live_bytes(plain, x)


@needs_mutable_cache
def test_every_greedy_option_is_bit_exact() -> None:
    plain, x = _model(), _inputs()
    units, profile = _units(plain, "0")
    options = keep_options(units, profile.storage_bytes, profile.modules["0"].inputs)
    assert len(options) >= 3 and options[-1] == sorted(options[-1])
    expected_out, expected_grads = _step(plain, x)
    for option in options:
        model = _model()
        _apply(model, {"0": _kept(units, option), "1": _kept(units, option)})
        out, grads = _step(model, x)
        assert torch.equal(out, expected_out)
        assert all(torch.equal(a, b) for a, b in zip(grads, expected_grads, strict=True))


@needs_mutable_cache
@pytest.mark.parametrize(
    ("part", "match"),
    [
        ("first draw", r"draws random numbers after a kept draw"),
        ("draw without its storage", r"is kept but writes in place into storage that is not"),
        ("storage without its draw", r"writes in place into a kept output but is not kept"),
    ],
)
def test_guard_refuses_calls_that_would_recompute_wrongly(part: str, match: str) -> None:
    model = _model()
    units, _ = _units(model, "0")
    first = next(unit for unit in units if unit.random)
    kept = {
        "first draw": tuple(first.calls),
        "draw without its storage": tuple(first.calls[1:]),
        "storage without its draw": tuple(first.calls[:1]),
    }[part]
    _apply(model, {"0": kept})
    state = copy.deepcopy(model.state_dict())
    with pytest.raises(CheckpointError, match=rf"^checkpointing: the operators of 0 .*{match}"):
        model(_inputs()).sum().backward()
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert all(p.grad is None for p in model.parameters())


def test_random_units_are_kept_as_a_suffix() -> None:
    calls = [
        _call("empty_like", 0, fresh=(1,)),
        _call("bernoulli_", 0, mutated=(1,), read=(1,), random=True, seconds=5.0),
        _call("mm", 0, fresh=(2,), read=(1,), seconds=0.1),
        _call("empty_like", 1, fresh=(3,)),
        _call("bernoulli_", 1, mutated=(3,), read=(3,), random=True, seconds=0.5),
    ]
    units = find_units(calls, mutable_cache=True)
    assert [unit.random for unit in units] == [True, False, True]
    options = keep_options(units, {1: 100, 2: 100, 3: 100}, set())
    for option in options:
        if 0 in option:  # the first draw is kept only with the later one
            assert 2 in option
    assert options[0] == [0, 2]  # the first draw's 6 s outweigh the second's 1.5 s
    assert not any(unit.keepable for unit in find_units(calls, mutable_cache=False) if unit.random)


def test_a_draw_that_cannot_be_kept_bars_the_draws_before_it() -> None:
    calls = [
        _call("empty_like", 0, fresh=(1,)),
        _call("bernoulli_", 0, mutated=(1,), read=(1,), random=True),
        _call("bernoulli_", 1, mutated=(9,), read=(9,), random=True),  # writes a module input
        _call("empty_like", 1, fresh=(3,)),
        _call("bernoulli_", 2, mutated=(3,), read=(3,), random=True),
    ]
    units = find_units(calls, mutable_cache=True)
    assert [unit.keepable for unit in units] == [False, True]


def test_a_unit_read_before_its_last_write_is_not_kept() -> None:
    calls = [
        _call("empty_like", 0, fresh=(1,)),
        _call("fill_", 0, mutated=(1,), read=(1,)),
        _call("sum", 0, fresh=(2,), read=(1,)),  # reads the half-written storage
        _call("mul_", 0, mutated=(1,), read=(1,)),
        _call("t", 0, read=(2,)),  # a view only aliases
        _call("empty_like", 1, fresh=(3,), read=(2,)),
        _call("add_", 0, mutated=(3,), read=(3, 2)),
    ]
    units = find_units(calls, mutable_cache=True)
    assert [unit.keepable for unit in units] == [False, True, True]
    assert units[2].writes == ["add_"]


def test_a_measured_decision_without_its_calls_is_refused() -> None:
    plan = CheckpointPlan(choices={"0": Decision(CHOSEN)}, **_FIELDS)
    with pytest.raises(ValueError, match=r"keeps chosen operator calls in '0' but names none"):
        plan.apply(_model())


def test_written_tensors_name_what_each_overload_writes_positionally_or_by_keyword() -> None:
    a, b, out = torch.ones(3), torch.ones(3), torch.empty(3)
    add_, add_out = torch.ops.aten.add_.Tensor, torch.ops.aten.add.out
    for _ in range(2):  # the second call reads the overload's facts back from the cache
        assert [t is a for t in written_tensors(add_, (a, b), {})] == [True]
        assert [t is out for t in written_tensors(add_out, (a, b), {"out": out})] == [True]
        assert written_tensors(torch.ops.aten.add.Tensor, (a, b), {}) == []
    assert _draws(torch.ops.aten.bernoulli_.float)
    assert not _draws(torch.ops.aten.add.Tensor)
