"""Fixed rules among the planner's options, and its choice under uncertainty.

torchtitan's operator rule (keep matmul and attention outputs, recompute every second
``aten.mm`` of each block call) is the operator-class grain with ``every_second_mm``:
offered per module call, priced like the class grain, exact, and kept in plan files.
Where two options' weighed estimates tie, the search takes the coarser grain, and a
finer grain wins only by more than its margin, whatever order the options come in.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import accel
from checkpointing import CheckpointPlan, Decision, plan_checkpointing
from checkpointing._decisions import ALTERNATE, FULL, SAVED, SELECTIVE
from checkpointing._measure import LiveActivationMeter
from checkpointing._selective import unavailable_reason
from checkpointing._selective_wrapper import SelectiveCheckpointWrapper
from checkpointing.planner import builtin_rates, cost
from checkpointing.planner._grains import candidates
from checkpointing.planner._options import Option, storage_bytes
from checkpointing.planner._profile import profile_step
from checkpointing.planner._records import ModuleProfile, StepProfile
from checkpointing.planner._search import GRAIN_MARGINS, Knapsack, search

NO_SELECTIVE = unavailable_reason()
needs_selective = pytest.mark.skipif(
    NO_SELECTIVE is not None, reason=f"operator-grain checkpointing: {NO_SELECTIVE}"
)
RULE_KIND = "every block: ops: pointwise, dropout, norm, every second mm"


class Block(nn.Module):
    """A pre-norm transformer block with bias-free projections: six ``aten.mm`` a call."""

    def __init__(self, width: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.qkv = nn.ModuleList(nn.Linear(width, width, bias=False) for _ in range(3))
        self.out = nn.Linear(width, width, bias=False)
        self.up = nn.Linear(width, 2 * width, bias=False)
        self.down = nn.Linear(2 * width, width, bias=False)
        self.drop = nn.Dropout(0.2)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, w = x.shape
        h = self.norm(x)
        q, k, v = (p(h).view(b, t, self.heads, -1).transpose(1, 2) for p in self.qkv)
        a = F.scaled_dot_product_attention(q, k, v, dropout_p=0.2, is_causal=True)
        x = x + self.drop(self.out(a.transpose(1, 2).reshape(b, t, w)))
        return x + self.drop(self.down(F.gelu(self.up(x))))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(Block(), Block()).train()


def _inputs() -> tuple[torch.Tensor]:
    return (torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(1)),)


def _step(model: nn.Module) -> list[torch.Tensor]:
    torch.manual_seed(5)
    out = model(*_inputs())
    out.square().sum().backward()
    found = [out.detach(), *(p.grad.clone() for p in model.parameters())]  # type: ignore[union-attr]
    model.zero_grad(set_to_none=True)
    return found


def _by_decision(options: list[Option], decision: str) -> Option:
    (found,) = [option for option in options if option.decision == decision]
    return found


class _CountMm(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.count += func == torch.ops.aten.mm.default
        return func(*args, **(kwargs or {}))


def _backward_mm_calls(model: nn.Module) -> int:
    torch.manual_seed(5)
    out = model(*_inputs())
    with _CountMm() as counter:
        out.square().sum().backward()
    model.zero_grad(set_to_none=True)
    return counter.count


def _live_bytes(model: nn.Module) -> int:
    with LiveActivationMeter(exclude=list(model.parameters())) as meter:
        out = model(*_inputs())
    return meter.bytes - out.untyped_storage().nbytes()


_FIELDS: dict[str, Any] = {
    "rows": (),
    **dict.fromkeys(("plain_bytes", "estimated_bytes", "budget_bytes"), 1),
    **dict.fromkeys(("estimated_step_time_ratio", "step_seconds"), 1.0),
}


@needs_selective
def test_torchtitans_rule_is_offered_per_call_and_priced_like_the_class_grain() -> None:
    recorded = profile_step(_model(), _inputs(), accel.get_backend("cpu"))
    profile = cost(recorded, builtin_rates("cpu"))
    options = candidates(profile, selective=True)
    record = profile.modules["0"]
    by_class, rule = _by_decision(options["0"], SELECTIVE), _by_decision(options["0"], ALTERNATE)
    assert rule.kind == "ops: pointwise, dropout, norm, every second mm"
    # The 2nd, 4th and 6th mm (k, out, down projections) are recomputed, not kept.
    halved = [op for op in record.ops if op.name == "aten.mm.default" and op.occurrence % 2]
    assert [op.occurrence for op in halved] == [1, 3, 5]
    dropped = frozenset(index for op in halved for index in op.fresh)
    assert rule.kept == by_class.kept - dropped and dropped <= by_class.kept
    assert rule.saved_bytes - by_class.saved_bytes == storage_bytes(profile, dropped) > 0
    rates = profile.rates
    expected = (
        by_class.seconds
        + sum(op.seconds for op in halved)
        - rates.policy_kept_seconds * (by_class.kept_count - rule.kept_count)
    )
    assert rule.seconds == pytest.approx(expected, rel=1e-12)
    assert rule.kept_count == by_class.kept_count - len(dropped)
    # Offered to the search beside its own grains: every block under the rule is weighed.
    plan = plan_checkpointing(_model(), _inputs(), 0.6)
    assert RULE_KIND in [c.label for c in plan.considered]


@needs_selective
def test_a_module_with_one_mm_gets_no_second_copy_of_the_class_grain() -> None:
    model = nn.Sequential(nn.Sequential(nn.Linear(8, 8, bias=False), nn.ReLU()), nn.Linear(8, 1))
    profile = cost(
        profile_step(model, (torch.randn(4, 8),), accel.get_backend("cpu")), builtin_rates("cpu")
    )
    decisions = [option.decision for option in candidates(profile, selective=True)["0"]]
    assert SELECTIVE in decisions and ALTERNATE not in decisions


@needs_selective
def test_the_rule_recomputes_every_second_mm_keeps_what_it_estimates_and_is_exact() -> None:
    plain = _model()
    expected = _step(plain)
    recorded = profile_step(_model(), _inputs(), accel.get_backend("cpu"))
    profile = cost(recorded, builtin_rates("cpu"))
    options = candidates(profile, selective=True)
    models = {}
    for decision in (SELECTIVE, ALTERNATE):
        model = _model()
        choices = dict.fromkeys(("0", "1"), Decision(decision))
        CheckpointPlan(choices=choices, **_FIELDS).apply(model)
        assert isinstance(model[0], SelectiveCheckpointWrapper)
        found = _step(model)  # dropout in attention and after both projections
        assert all(torch.equal(a, b) for a, b in zip(found, expected, strict=True)), decision
        models[decision] = model
    assert "every second mm" in repr(models[ALTERNATE][0])
    # Three more mm per block call run in backward: the k, out and down projections.
    recomputed = _backward_mm_calls(models[ALTERNATE]) - _backward_mm_calls(models[SELECTIVE])
    assert recomputed == 2 * 3
    # What it keeps less is what the profile says the rule saves more, to the byte.
    fewer = _live_bytes(models[SELECTIVE]) - _live_bytes(models[ALTERNATE])
    gains = [
        _by_decision(options[n], ALTERNATE).saved_bytes
        - _by_decision(options[n], SELECTIVE).saved_bytes
        for n in ("0", "1")
    ]
    assert fewer == sum(gains) > 0


@needs_selective
def test_the_rule_survives_the_plan_file_and_older_files_still_load(tmp_path: Path) -> None:
    plan = plan_checkpointing(_model(), _inputs(), 0.6)
    plan = replace(plan, choices=dict.fromkeys(("0", "1"), Decision(ALTERNATE)))
    assert plan.margins == GRAIN_MARGINS
    assert all(c.weighed_seconds is not None for c in plan.considered)
    path = tmp_path / "plan.json"
    plan.save(path)
    loaded = CheckpointPlan.load(path)
    assert loaded.to_dict() == plan.to_dict() and loaded.decisions["0"] == ALTERNATE
    model = _model()
    loaded.apply(model, example_inputs=_inputs())
    assert all(torch.equal(a, b) for a, b in zip(_step(model), _step(_model()), strict=True))
    # A file written before the margins: no "margins", six fields per considered plan.
    older = json.loads(path.read_text())
    del older["margins"]
    older["considered"] = [row[:6] for row in older["considered"]]
    path.write_text(json.dumps(older))
    old = CheckpointPlan.load(path)
    assert old.margins == {} and all(c.weighed_seconds is None for c in old.considered)
    assert old.decisions == plan.decisions


def test_a_decision_this_release_does_not_know_is_refused_before_wrapping() -> None:
    model = _model()
    plan = CheckpointPlan(choices={"0": Decision("recompute something new")}, **_FIELDS)
    with pytest.raises(ValueError, match=r"^checkpointing: this plan says 'recompute something"):
        plan.apply(model)
    assert not any(isinstance(m, SelectiveCheckpointWrapper) for m in model.modules())


def test_the_wrapper_refuses_chosen_calls_with_the_rule() -> None:
    with pytest.raises(ValueError, match=r"takes kept_calls or every_second_mm, not both"):
        SelectiveCheckpointWrapper(nn.Linear(2, 2), kept_calls=(), every_second_mm=True)


# Choice under uncertainty, on a synthetic profile: two sibling blocks "a" and "b", each
# owning a 300-byte and a 200-byte storage; the plain step keeps 1000 bytes (a byte a
# unit of the knapsack's table).


def _profile() -> StepProfile:
    modules = {
        "": ModuleProfile("", children=["a", "b"]),
        "a": ModuleProfile("a", kind="Block"),
        "b": ModuleProfile("b", kind="Block"),
    }
    storage = {0: 300, 1: 200, 2: 300, 3: 200}
    saved_by = {0: {("", "a")}, 1: {("", "a")}, 2: {("", "b")}, 3: {("", "b")}}
    return StepProfile(modules, storage, saved_by, 1.0, 0.5, builtin_rates("cpu"))


def _options(whole: float, finer: float, decision: str = SAVED) -> dict[str, list[Option]]:
    """Per block: whole (saves 500 bytes) and a finer grain (saves 300, keeps 200)."""
    return {
        name: [
            Option(FULL, 500, whole, frozenset()),
            Option(decision, 300, finer, frozenset({kept})),
        ]
        for name, kept in (("a", 1), ("b", 3))
    }


def _decisions(options: dict[str, list[Option]], budget: int) -> dict[str, str]:
    _, taken = search(_profile(), options, budget, budget)
    return {name: option.decision for name, option in taken.chosen.items()}


@pytest.mark.parametrize("reverse", [False, True])
def test_a_tie_takes_the_coarser_grain_in_whatever_order_options_come(reverse: bool) -> None:
    # 1.0 s with the saved-tensor grain's 0.5 margin weighs 1.5 s: the whole module's.
    assert GRAIN_MARGINS[SAVED] == 0.5 and GRAIN_MARGINS[FULL] == 0.0
    options = _options(whole=1.5, finer=1.0)
    if reverse:
        options = {name: list(reversed(found)) for name, found in options.items()}
    for budget in (700, 500, 300):  # 300 bytes saved, 500, then 700
        assert set(_decisions(options, budget).values()) == {FULL}, budget
    first, again = Knapsack(_profile(), options), Knapsack(_profile(), options)
    assert all(first.chosen(units) == again.chosen(units) for units in range(0, 1001, 25))


def test_a_module_own_option_wins_a_tie_with_a_combination_inside_it() -> None:
    profile = _profile()
    profile.modules[""] = ModuleProfile("", children=["p"])
    profile.modules["p"] = ModuleProfile("p", children=["a", "b"])
    profile.saved_by = {
        0: {("", "p", "a")},
        1: {("", "p", "a")},
        2: {("", "p", "b")},
        3: {("", "p", "b")},
    }
    # "p" whole saves all 1000 bytes at 3.0 s; both blocks whole inside weigh 3.0 s too.
    options = {**_options(whole=1.5, finer=1.0), "p": [Option(FULL, 1000, 3.0, frozenset())]}
    assert list(Knapsack(profile, options).chosen(1000)) == ["p"]


def test_a_finer_grain_wins_only_by_more_than_its_margin_at_every_budget() -> None:
    # Estimated faster than whole (0.8 s < 1.0 s), but not by its margin (0.8 x 1.5 = 1.2):
    # looser budgets, which could keep 200 bytes of a block, keep blocks whole all the same.
    close = _options(whole=1.0, finer=0.8)
    for budget in (0, 300, 500, 700):
        assert set(_decisions(close, budget).values()) == {FULL}, budget
    # Faster by more than its margin (0.6 x 1.5 = 0.9 s): taken wherever the bytes allow.
    clear = _options(whole=1.0, finer=0.6)
    assert set(_decisions(clear, 0).values()) == {FULL}  # every byte: both whole
    assert set(_decisions(clear, 300).values()) == {FULL, SAVED}
    assert set(_decisions(clear, 500).values()) == {FULL}  # one whole beats both finer
    assert set(_decisions(clear, 700).values()) == {SAVED}
    # The operator class's smaller margin (0.10) lets the same 0.8 s win.
    assert set(_decisions(_options(1.0, 0.8, SELECTIVE), 700).values()) == {SELECTIVE}


def test_the_margins_and_the_weighed_plans_are_recorded() -> None:
    plan = plan_checkpointing(_model(), _inputs(), 0.5, selective=False)
    assert plan.margins == GRAIN_MARGINS
    (taken,) = [c for c in plan.considered if c.taken]
    assert taken.weighed_seconds is not None and taken.weighed_seconds >= taken.estimated_seconds
    assert "margin" in taken.reason
