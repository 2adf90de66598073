"""Saved-tensor grain: dropped tensors recomputed bit for bit, masks packed, mismatches refused."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
from _grain_rates import SAVED_GRAIN_FREE  # loaded by tests/conftest.py
from torch import nn

import accel
from accel import _compat
from checkpointing import CheckpointError, plan_checkpointing
from checkpointing._decisions import SAVED
from checkpointing._measure import LiveActivationMeter
from checkpointing._packed import Packed
from checkpointing._replay import replayable
from checkpointing._saved_plan import DROP, PACK
from checkpointing._saved_wrapper import SavedTensorWrapper
from checkpointing.planner import builtin_rates, cost
from checkpointing.planner._profile import profile_step
from checkpointing.planner._saved_grain import SavedUnit, saved_plan, saved_units

WIDTH, SEQ, BATCH = 32, 16, 4


class Stack(nn.Module):
    """Post-norm transformer layers with dropout, as the budget benchmark's stack."""

    def __init__(self, layers: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(WIDTH, 4, 4 * WIDTH, dropout=0.1, batch_first=True)
            for _ in range(layers)
        )
        self.head = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = Stack()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _model() -> Model:
    torch.manual_seed(0)
    return Model().train()


def _inputs(seq: int = SEQ) -> torch.Tensor:
    return torch.randn(BATCH, seq, WIDTH, generator=torch.Generator().manual_seed(1))


def _step(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    torch.manual_seed(7)
    loss = model(x).square().mean()
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()]


def _assert_same_step(model: nn.Module, reference: nn.Module, x: torch.Tensor) -> None:
    loss, grads = _step(model, x)
    expected_loss, expected_grads = _step(reference, x)
    assert torch.equal(loss, expected_loss)
    for grad, expected in zip(grads, expected_grads, strict=True):
        assert grad is not None and expected is not None and torch.equal(grad, expected)


def _live_bytes(model: nn.Module, x: torch.Tensor) -> int:
    with LiveActivationMeter(exclude=[*model.parameters(), *model.buffers()]) as meter:
        out = model(x)
    held = meter.bytes - out.untyped_storage().nbytes()
    out.sum().backward()
    model.zero_grad(set_to_none=True)
    return held


def _prefixes(model: nn.Module, x: torch.Tensor) -> list[list[SavedUnit]]:
    backend = accel.get_backend("cpu")
    return saved_units(cost(profile_step(model, (x,), backend), builtin_rates("cpu")), "body")


def test_every_greedy_prefix_is_bit_exact_with_dropout() -> None:
    reference, x = _model(), _inputs()
    backend = accel.get_backend("cpu")
    profile = cost(profile_step(reference, (x,), backend), builtin_rates("cpu"))
    prefixes = saved_units(profile, "body")
    actions = {unit.action for unit in prefixes[-1]}
    assert actions == {DROP, PACK}, "the stack has cheap recipes and host dropout masks"
    for units in prefixes:
        model = copy.deepcopy(reference)
        model.body = SavedTensorWrapper(model.body, saved_plan(profile, "body", units))
        _assert_same_step(model, copy.deepcopy(reference), x)


class _Gated(nn.Module):
    """``x + h * sigmoid(h)`` with ``h = gelu(linear(x))``: ``h`` is saved twice."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = nn.functional.gelu(self.linear(x))
        return x + hidden * torch.sigmoid(hidden)


def test_a_dropped_tensor_is_recomputed_once_per_backward() -> None:
    # A storage saved at several positions (the GELU's output, read by the product's
    # backward and by the sigmoid's), or computed on the way to another dropped one (the
    # GELU again, in the sigmoid's recipe), is recomputed once: the rest wait in the
    # run's cache until their last unpack.
    torch.manual_seed(0)
    reference = nn.Sequential(_Gated(), _Gated())
    x = _inputs()
    profile = cost(profile_step(reference, (x,), accel.get_backend("cpu")), builtin_rates("cpu"))
    units = [unit for unit in saved_units(profile, "")[-1] if unit.action == DROP]
    plan = saved_plan(profile, "", units)
    shared = [i for i in plan.recipes if sum(p[1] == i for p in plan.positions.values()) > 1]
    assert shared, "the GELU's output is dropped and saved at two positions"
    runs: list[tuple[str, tuple[int | None, ...]]] = []
    for steps in plan.recipes.values():
        for step in steps:
            func = step.func

            def counted(*args: Any, _func: Any = func, _step: Any = step, **kwargs: Any) -> Any:
                runs.append((_step.name, _step.outputs))
                return _func(*args, **kwargs)

            object.__setattr__(step, "func", counted)
    model = SavedTensorWrapper(copy.deepcopy(reference), plan)
    _step(model, x)  # the first call is checked: its recipes run in the forward
    model.zero_grad(set_to_none=True)
    runs.clear()
    _assert_same_step(model, copy.deepcopy(reference), x)
    assert runs and len(runs) == len(set(runs)), "no recorded call ran twice in one backward"


def test_the_longest_prefix_holds_what_it_promises() -> None:
    reference, x = _model(), _inputs()
    backend = accel.get_backend("cpu")
    profile = cost(profile_step(reference, (x,), backend), builtin_rates("cpu"))
    units = saved_units(profile, "body")[-1]
    model = copy.deepcopy(reference)
    model.body = SavedTensorWrapper(model.body, saved_plan(profile, "body", units))
    plain = _live_bytes(reference, x)
    slimmed = _live_bytes(model, x)
    promised = sum(unit.saved_bytes for unit in units)
    assert slimmed < plain
    # Each packed mask also holds a 0-dim scale; nothing else beyond the promise.
    scales = sum(1 for unit in units if unit.action == PACK) * 16
    assert plain - slimmed >= promised - scales - sum(
        profile.storage_bytes[i] for unit in units for i in unit.inputs
    )


def test_budget_plans_use_the_saved_grain_exactly_and_fit() -> None:
    reference, x = _model(), _inputs()
    model = copy.deepcopy(reference)
    plain = _live_bytes(reference, x)
    plan = plan_checkpointing(model, (x,), memory_budget=0.7, rates=SAVED_GRAIN_FREE)
    assert SAVED in plan.decisions.values()
    assert "saved:" in str(plan)
    keys = list(model.state_dict())
    plan.apply(model)
    assert list(model.state_dict()) == keys
    assert any(isinstance(m, SavedTensorWrapper) for m in model.modules())
    _assert_same_step(model, copy.deepcopy(reference), x)
    # The live-tensor count sees a little more than autograd saves in both runs; what
    # the plan removes is what it promised, less each packed mask's 0-dim scale.
    promised = plan.plain_bytes - plan.estimated_bytes
    assert plain - _live_bytes(model, x) >= promised - 256
    assert plan.estimated_bytes <= plan.budget_bytes


def test_a_deep_copy_of_a_planned_model_trains_exactly_without_a_warning() -> None:
    # An EMA copy or a test's reference: the copy's recipes are new objects, and the
    # plan's index of them was keyed by the originals' ids (its first backward failed);
    # copying the index's pytree specs warns on torch 2.13.
    model, reference, x = _saved_plan_everywhere()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        copied = copy.deepcopy(model)
    _assert_same_step(copied, copy.deepcopy(reference), x)
    _assert_same_step(model, copy.deepcopy(reference), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dropout_masks_are_packed_and_rebuilt_exactly(dtype: torch.dtype) -> None:
    mask = torch.empty(64, 33, dtype=dtype).bernoulli_(0.7).div_(0.7)
    packed = Packed.of(mask)
    assert packed is not None and packed.flags.dtype == torch.bool
    rebuilt = packed.unpack()
    assert rebuilt.dtype == dtype and torch.equal(rebuilt, mask)
    assert torch.equal(rebuilt.signbit(), mask.signbit())


@pytest.mark.parametrize(
    "spoil",
    [
        lambda t: t.view(-1)[3].fill_(0.5),  # a third value
        lambda t: t.view(-1)[3].fill_(float("nan")),
        lambda t: t.view(-1)[3].fill_(-1.0),
        lambda t: t.mul_(0.25),  # scale below 1: x * (x - s) could underflow
    ],
)
def test_tensors_that_are_not_masks_are_not_packed(spoil: object) -> None:
    mask = torch.empty(64, 33).bernoulli_(0.5).div_(0.5)
    spoil(mask)  # type: ignore[operator]
    assert Packed.of(mask) is None
    whole = torch.empty(8, 8).bernoulli_(0.5).div_(0.5)
    assert Packed.of(whole[:4]) is None  # part of a storage
    assert Packed.of(whole[:1].expand(8, 8)) is None


def test_a_transposed_mask_is_packed_with_its_strides() -> None:
    mask = torch.empty(8, 6).bernoulli_(0.5).div_(0.5).t()
    packed = Packed.of(mask)
    assert packed is not None
    rebuilt = packed.unpack()
    assert rebuilt.stride() == mask.stride() and torch.equal(rebuilt, mask)


def test_a_changed_input_is_refused_with_generators_and_gradients_untouched() -> None:
    model, x = _model(), _inputs()
    # No selective grain: the saved grain is the one under test, in every layer.
    plan = plan_checkpointing(model, (x,), 0.6, selective=False, rates=SAVED_GRAIN_FREE)
    assert set(plan.decisions.values()) == {SAVED}
    plan.apply(model)
    longer = _inputs(SEQ + 3)
    state = torch.get_rng_state()
    with pytest.raises(
        CheckpointError, match=r"^checkpointing: the saved tensors of body\S* no longer match"
    ):
        model(longer)
    assert torch.equal(torch.get_rng_state(), state)
    assert all(p.grad is None for p in model.parameters())


def _saved_plan_everywhere() -> tuple[Model, Model, torch.Tensor]:
    reference, x = _model(), _inputs()
    model = copy.deepcopy(reference)
    plan = plan_checkpointing(model, (x,), 0.6, selective=False, rates=SAVED_GRAIN_FREE)
    assert set(plan.decisions.values()) == {SAVED}
    plan.apply(model)
    return model, reference, x


def _assert_same_grads(model: nn.Module, reference: nn.Module) -> None:
    for param, expected in zip(model.parameters(), reference.parameters(), strict=True):
        if expected.grad is None:
            assert param.grad is None
        else:
            assert param.grad is not None and torch.equal(param.grad, expected.grad)
    model.zero_grad(set_to_none=True)
    reference.zero_grad(set_to_none=True)


def test_an_input_that_needs_grad_where_the_example_did_not_checkpoints_whole() -> None:
    model, reference, x = _saved_plan_everywhere()
    plain = _live_bytes(reference, x.clone().requires_grad_(True))
    wanting, expected_input = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    with pytest.warns(
        UserWarning, match=r"^checkpointing: 'body[\w.]*' was planned .* need for grad"
    ):
        loss, _ = _step(model, wanting)
    expected_loss, _ = _step(reference, expected_input)
    assert torch.equal(loss, expected_loss)
    assert wanting.grad is not None and torch.equal(wanting.grad, expected_input.grad)
    _assert_same_grads(model, reference)
    # Checkpointed whole, the planned modules keep their inputs only: less than plain.
    assert _live_bytes(model, x.clone().requires_grad_(True)) < plain
    # The plan itself still runs where the pattern matches it.
    _assert_same_step(model, reference, x)


def test_a_parameter_frozen_after_planning_checkpoints_whole_and_warns_once() -> None:
    model, reference, x = _saved_plan_everywhere()
    # A parameter of a module the plan put at the saved-tensor grain (which ones differs
    # between torch releases).
    wrapper, name = next(
        (m, name)
        for m in model.modules()
        if isinstance(m, SavedTensorWrapper)
        for name, _ in m.module.named_parameters()
    )
    wrapper.module.get_parameter(name).requires_grad_(False)
    reference.get_submodule(wrapper.plan.module).get_parameter(name).requires_grad_(False)
    with pytest.warns(UserWarning, match="frozen or unfrozen") as caught:
        for _ in range(2):
            loss, _ = _step(model, x)
            assert torch.equal(loss, _step(reference, x)[0])
            _assert_same_grads(model, reference)
    assert len([w for w in caught if "checkpointed whole" in str(w.message)]) == 1


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.sin(x))


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = Scaled()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _scaled_with_recipe() -> tuple[Outer, torch.Tensor]:
    torch.manual_seed(0)
    model, x = Outer(), torch.randn(4, WIDTH, requires_grad=True)
    profile = cost(profile_step(model, (x,), accel.get_backend("cpu")), builtin_rates("cpu"))
    units = saved_units(profile, "body")[-1]
    assert [unit.label for unit in units] == ["sin"] and units[0].inputs
    model.body = SavedTensorWrapper(model.body, saved_plan(profile, "body", units))
    return model, x


def test_an_input_modified_in_place_after_the_forward_is_refused() -> None:
    model, x = _scaled_with_recipe()
    out = model(x)
    with torch.no_grad():
        x.add_(1.0)
    with pytest.raises(RuntimeError, match=r"modified in place after its forward"):
        out.sum().backward()


@pytest.mark.skipif(
    not _compat.SAVED_TENSORS_HOOKS_VISIBLE,
    reason="torch 2.4 cannot report the active saved-tensor hooks to Python",
)
def test_hooks_active_outside_still_pack_the_other_saved_tensors() -> None:
    model, x = _scaled_with_recipe()
    reference = copy.deepcopy(model.body.module)
    seen: list[int] = []

    def pack(tensor: torch.Tensor) -> tuple[str, torch.Tensor]:
        seen.append(tensor.numel())
        return "outer", tensor

    def unpack(packed: tuple[str, torch.Tensor]) -> torch.Tensor:
        assert packed[0] == "outer"
        return packed[1]

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = model(x)
    out.sum().backward()
    expected = reference(x)
    expected.sum().backward()
    assert torch.equal(out, expected)
    for param, ref in zip(model.parameters(), reference.parameters(), strict=True):
        assert param.grad is not None and ref.grad is not None
        assert torch.equal(param.grad, ref.grad)
    # sin's output (the linear layer's input) is dropped; sin's own input goes outside.
    assert seen and x.numel() in seen


def test_only_operators_that_replay_bit_for_bit_are_recomputed() -> None:
    aten = torch.ops.aten
    for func in (aten.mul.Tensor, aten.native_layer_norm.default, aten.addmm.default):
        assert replayable(func)
    for func in (aten.bernoulli_.float, aten.empty_like.default, aten.view.default):
        assert not replayable(func), func


def test_without_grad_the_wrapper_runs_the_module_plainly() -> None:
    model, x = _scaled_with_recipe()
    with torch.no_grad():
        assert torch.equal(model(x), model.body.module(x))
