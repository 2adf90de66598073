"""Cost as its own pass (issue 40): the profile records FLOPs and bytes, ``cost`` prices it.

A step recorded once (:func:`checkpointing.profile_step`) plans at any rates without
running the model again, and each plan is the plan made from scratch at those rates.
The pass is pure: pricing leaves the recorded step as it was. Grouped and depthwise
convolutions, FFTs and grouped matrix products (a mixture of experts' expert layers) are
counted by their formulas.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch
from torch import nn

import accel
from accel._compat import fake_profile_unavailable
from checkpointing import RecordedStep, plan_checkpointing, profile_step
from checkpointing.planner import StepProfile, builtin_rates, cost
from checkpointing.planner._pricing import backward_seconds, op_seconds
from checkpointing.planner._work import CONVOLUTION, FFT, MATMUL, OpWork, op_work

aten = torch.ops.aten


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(16, 64), nn.Linear(64, 16)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.down(torch.nn.functional.gelu(self.up(x))))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(_Block() for _ in range(4)))


def _inputs() -> tuple[torch.Tensor]:
    return (torch.randn(8, 16, generator=torch.Generator().manual_seed(1)),)


def _slow_memory() -> Any:
    """The built-in CPU rates with memory 50 times slower: another plan's prices."""
    rates = builtin_rates("cpu")
    return dataclasses.replace(
        rates,
        source="given",
        memory_bytes=rates.memory_bytes / 50,
        operator_bytes={k: v / 50 for k, v in rates.operator_bytes.items()},
    )


def _forwards(model: nn.Module) -> list[int]:
    calls = [0]

    def count(module: nn.Module, args: Any) -> None:
        calls[0] += 1

    model.register_forward_pre_hook(count)
    return calls


def test_a_recorded_step_plans_at_two_rates_with_one_step_and_the_same_plans() -> None:
    model, inputs = _model(), _inputs()
    fast, slow = builtin_rates("cpu"), _slow_memory()
    fresh = [plan_checkpointing(model, inputs, 0.5, rates=rates) for rates in (fast, slow)]
    forwards = _forwards(model)
    profile = profile_step(model, inputs)
    # One real forward without grad that records the calls, then the fake step (where
    # fake tensors are unavailable, torch 2.4, the one real forward is the profile).
    once = 1 if fake_profile_unavailable() else 2
    assert isinstance(profile, RecordedStep) and forwards == [once]
    reused = [
        plan_checkpointing(model, inputs, 0.5, rates=rates, profile=profile)
        for rates in (fast, slow)
    ]
    assert forwards == [once], "planning with profile= ran the model again"
    for again, made in zip(reused, fresh, strict=True):
        assert str(again) == str(made) and again.to_dict() == made.to_dict()
    assert reused[0].step_seconds < reused[1].step_seconds


def test_cost_is_pure_and_sums_the_calls_in_order() -> None:
    recorded = profile_step(_model(), _inputs())
    before = [(call.seconds, call.work) for r in recorded.modules.values() for call in r.ops]
    rates = builtin_rates("cpu")
    priced = cost(recorded, rates)
    assert isinstance(priced, StepProfile) and priced.rates is rates
    assert cost(recorded, rates) == priced, "the same recorded step and rates, the same prices"
    after = [(call.seconds, call.work) for r in recorded.modules.values() for call in r.ops]
    assert after == before and {seconds for seconds, _ in after} == {0.0}
    forward = 0.0
    for work in recorded.forward:
        forward += op_seconds(work, rates)
    backward = 0.0
    for work in recorded.backward:
        backward += op_seconds(work, rates)
    if recorded.fallback:  # torch 2.4: one real forward, the backward estimated from it
        assert not recorded.backward and backward == 0.0
        for work in recorded.forward:
            backward += backward_seconds(work, op_seconds(work, rates))
    assert priced.forward_time == forward and priced.step_time == forward + backward
    record = priced.modules["0"]
    total = 0.0
    for call in record.ops:
        assert call.work is not None and call.seconds == op_seconds(call.work, rates)
        total += call.seconds
    assert record.forward_time == total > record.recomputed_time > 0


def test_a_profile_of_another_model_or_other_inputs_is_refused() -> None:
    profile = profile_step(_model(), _inputs())
    with pytest.raises(ValueError, match="recorded for another model: it has"):
        plan_checkpointing(nn.Sequential(_Block(), _Block()), _inputs(), 0.5, profile=profile)
    with pytest.raises(
        ValueError, match=r"other inputs: it has 'float32\[8, 16\]' where these inputs have"
    ):
        plan_checkpointing(_model(), (torch.randn(4, 16),), 0.5, profile=profile)
    frozen = _model()
    frozen[0].up.weight.requires_grad_(False)
    with pytest.raises(ValueError, match="while other parameters or inputs required grad"):
        plan_checkpointing(frozen, _inputs(), 0.5, profile=profile)
    with pytest.raises(TypeError, match=r"profile must be what checkpointing\.profile_step"):
        plan_checkpointing(_model(), _inputs(), 0.5, profile=cost(profile, builtin_rates("cpu")))


def _work(func: Any, *args: Any) -> OpWork:
    out = func(*args)
    results = out if isinstance(out, tuple) else (out,)
    fresh = sum(t.untyped_storage().nbytes() for t in results if isinstance(t, torch.Tensor))
    return op_work(func, args, {}, out, fresh)


@pytest.mark.parametrize("transposed", [False, True])
def test_a_depthwise_convolution_counts_2_W_N_S_per_pass_and_gradient(transposed: bool) -> None:
    # Depthwise: 6 channels, 6 groups, a 3x3 kernel; S: the 5x5 positions it visits.
    n, channels, side = 2, 6, 5
    x = torch.randn(n, channels, side, side)
    w = torch.randn(channels, 1, 3, 3)
    args = ([1, 1], [1, 1], [1, 1], transposed, [0, 0], channels)
    forward = _work(aten.convolution.default, x, w, None, *args)
    flops = 2 * w.numel() * n * side * side  # 2 |W| N S
    assert forward.kind == CONVOLUTION and forward.flops == flops
    grad = torch.randn(n, channels, side, side)
    backward = _work(aten.convolution_backward.default, grad, x, w, None, *args, [True] * 3)
    assert backward.kind == CONVOLUTION and backward.flops == 2 * flops  # input's + weight's
    weight_only = _work(aten.convolution_backward.default, grad, x, w, None, *args, [0, 1, 0])
    assert weight_only.flops == flops  # flop_counter's formula gives 6 times this


def test_a_grouped_convolution_agrees_with_flop_counter_at_one_group() -> None:
    from torch.utils.flop_counter import FlopCounterMode

    x, w = torch.randn(2, 4, 6, 6), torch.randn(8, 4, 3, 3)
    grad = torch.randn(2, 8, 4, 4)
    args = ([1, 1], [0, 0], [1, 1], False, [0, 0], 1, [True, True, False])
    with FlopCounterMode(display=False) as counter:
        aten.convolution_backward.default(grad, x, w, None, *args)
    ours = _work(aten.convolution_backward.default, grad, x, w, None, *args).flops
    assert ours == counter.get_total_flops() == 2 * (2 * w.numel() * 2 * 4 * 4)


@pytest.mark.parametrize(
    ("func", "shape", "args", "points", "transforms"),
    [
        (aten._fft_r2c.default, (3, 64), ([1], 0, True), 64, 3),
        (aten._fft_c2c.default, (2, 8, 16), ([1, 2], 0, True), 128, 2),
        (aten._fft_c2r.default, (4, 17), ([1], 0, 32), 32, 4),  # N: the real output's
    ],
)
def test_an_fft_counts_5_N_log2_N_per_transform(
    func: Any, shape: tuple[int, ...], args: tuple[Any, ...], points: int, transforms: int
) -> None:
    real = func is aten._fft_r2c.default
    signal = torch.randn(shape) if real else torch.randn(shape, dtype=torch.complex64)
    work = _work(func, signal, *args)
    assert work.kind == FFT
    assert work.flops == round(5 * transforms * points * math.log2(points))


def test_an_fft_is_priced_by_its_flops_or_its_bytes_whichever_takes_longer() -> None:
    work = _work(aten._fft_r2c.default, torch.randn(4, 1024), [1], 0, True)
    rates = builtin_rates("cpu")
    by_bytes = (work.read_bytes + work.fresh_bytes) / rates.memory_bytes
    by_flops = work.flops / rates.matmul_flops
    assert op_seconds(work, rates) == max(by_flops, by_bytes) + rates.call_seconds
    slow_flops = dataclasses.replace(rates, matmul_flops=1e6)
    assert op_seconds(work, slow_flops) == work.flops / 1e6 + rates.call_seconds
    fast_flops = dataclasses.replace(rates, matmul_flops=1e18, memory_bytes=1e3)
    moved = work.read_bytes + work.fresh_bytes
    assert op_seconds(work, fast_flops) == moved / 1e3 + rates.call_seconds


_OFFS = torch.tensor([4, 4, 12], dtype=torch.int32)  # three groups, the second empty


def _group_products(first: torch.Tensor, second: torch.Tensor) -> list[tuple[Any, Any]]:
    """The plain products a grouped one stands for, group by group (``_OFFS``'s layout)."""
    bounds = list(zip([0, *_OFFS.tolist()[:-1]], _OFFS.tolist(), strict=True))
    if first.dim() == 3 and second.dim() == 3:
        return [(first[g], second[g]) for g in range(first.shape[0])]
    if first.dim() == 2 and second.dim() == 3:  # rows (tokens) split, one weight each
        return [(first[a:b], second[g]) for g, (a, b) in enumerate(bounds)]
    if first.dim() == 3:  # columns split
        return [(first[g], second[:, a:b]) for g, (a, b) in enumerate(bounds)]
    return [(first[:, a:b], second[a:b]) for a, b in bounds]  # the contracted size split


@pytest.mark.skipif(
    not hasattr(aten, "_grouped_mm"), reason="this torch has no aten._grouped_mm (added in 2.8)"
)
@pytest.mark.parametrize(
    ("first", "second"),
    [((12, 8), (3, 8, 4)), ((3, 4, 8), (3, 8, 4)), ((3, 4, 8), (8, 12)), ((4, 12), (12, 8))],
    ids=["2d-3d", "3d-3d", "3d-2d", "2d-2d"],
)
def test_a_grouped_matrix_product_counts_the_flops_of_its_groups_products(
    first: tuple[int, ...], second: tuple[int, ...]
) -> None:
    from torch.utils.flop_counter import FlopCounterMode

    a, b = torch.randn(first), torch.randn(second)
    offs = None if len(first) == len(second) == 3 else _OFFS
    out = aten._grouped_mm.default(a, b, offs=offs)
    work = op_work(aten._grouped_mm.default, (a, b), {"offs": offs}, out, 0)
    with FlopCounterMode(display=False) as counter:
        products = [torch.mm(x, y) for x, y in _group_products(a, b)]
    # The groups are the ones the kernel computes: stacked, or joined along what is split.
    joined = torch.stack(products) if out.dim() == 3 else torch.cat(products, 3 - b.dim())
    torch.testing.assert_close(out, joined)
    assert work.kind == MATMUL
    assert work.flops == counter.get_total_flops() > 0


def test_a_view_moves_nothing_and_costs_the_call_alone() -> None:
    work = op_work(aten.view.default, (torch.ones(4, 4), [16]), {}, torch.ones(16), 0)
    assert not work.moves and work.read_bytes == 64
    assert op_seconds(work, builtin_rates("cpu")) == builtin_rates("cpu").call_seconds


@pytest.mark.parametrize(
    ("func", "args"),
    [
        (aten.empty_like.default, (torch.ones(256, 256),)),
        (aten.empty.memory_format, ([256, 256],)),
        (aten.new_empty_strided.default, (torch.ones(2), [256, 256], [256, 1])),
    ],
)
def test_an_allocation_left_unwritten_costs_the_call_alone(func: Any, args: Any) -> None:
    # It returns pages it never touches: the first call that writes them pays for them.
    out = func(*args)
    work = op_work(func, args, {}, out, out.untyped_storage().nbytes())
    assert work.fresh_bytes == 256 * 256 * 4 and not work.moves
    assert op_seconds(work, builtin_rates("cpu")) == builtin_rates("cpu").call_seconds
    # An allocation that writes its bytes is priced by them.
    like = torch.ones(256, 256)
    filled = op_work(aten.ones_like.default, (like,), {}, torch.ones_like(like), 256 * 256 * 4)
    assert filled.moves
    assert op_seconds(filled, builtin_rates("cpu")) > builtin_rates("cpu").call_seconds


def test_profile_step_records_for_the_backend_it_names() -> None:
    profile = profile_step(_model(), _inputs(), backend="cpu")
    assert profile.device_type == accel.get_backend("cpu").device_type
    assert profile.plain_bytes > 0 and profile.forward
    assert bool(profile.backward) == (not profile.fallback)  # a real forward has none


def test_a_prim_query_only_the_fake_step_dispatches_costs_nothing() -> None:
    # A fake tensor answers ``tensor.device`` through ``prim.device``; a real one does not
    # dispatch at all, so the device's step pays nothing for it (T5 made 5,322 of them).
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list[str] = []

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    real = torch.ones(3)
    with Spy():
        _ = real.device
    assert seen == []
    device = torch.ops.prim.device.default
    work = op_work(device, (torch.ones(3),), {}, torch.device("cpu"), 0)
    assert work.operator == "prim.device.default"
    assert op_seconds(work, builtin_rates("cpu")) == 0.0


def _priced_free_and_dear(field: str, rates: Any = None) -> tuple[Any, Any, list[tuple[Any, Any]]]:
    """The test model's profile priced with ``field`` at 0 and at 10 ms, and each
    option's two prices, paired (the same option, offered in the same order).

    ``rates`` are the rates to start from (``None``: this host's built-in table).
    """
    from checkpointing.planner._grains import candidates

    recorded = profile_step(_model(), _inputs())
    rates = builtin_rates("cpu") if rates is None else rates
    assert getattr(rates, field) > 0  # measured on the CPU table's machine
    free = cost(recorded, dataclasses.replace(rates, **{field: 0.0}))
    dear = cost(recorded, dataclasses.replace(rates, **{field: 0.01}))
    offered_dear = candidates(dear, selective=True)
    pairs = []
    for name, options in candidates(free, selective=True).items():
        for cheap, costly in zip(options, offered_dear[name], strict=True):
            assert (cheap.decision, cheap.kept) == (costly.decision, costly.kept)
            pairs.append((cheap, costly))
    return free, dear, pairs


def test_a_checkpointed_call_is_priced_with_the_checkpoints_own_cost() -> None:
    from checkpointing._decisions import ALTERNATE, CHOSEN, FULL, SAVED, SELECTIVE

    free, dear, pairs = _priced_free_and_dear("region_seconds")
    for cheap, costly in pairs:
        # Whole and selective calls are checkpoints: each pays one region's cost.
        # The saved-tensor grain's machinery is priced by its own rates.
        region = 0.01 if cheap.decision in (FULL, SELECTIVE, ALTERNATE, CHOSEN) else 0.0
        assert costly.seconds - cheap.seconds == pytest.approx(region, abs=1e-12)
    checked = {cheap.decision for cheap, _ in pairs}
    assert FULL in checked and SAVED in checked
    # A dear region moves the same budget's plan off checkpoints, onto the saved grain.
    regions = (FULL, SELECTIVE, ALTERNATE, CHOSEN)
    many = plan_checkpointing(_model(), _inputs(), 0.5, rates=free.rates)
    few = plan_checkpointing(_model(), _inputs(), 0.5, rates=dear.rates)
    assert sum(d in regions for d in few.decisions.values()) < sum(
        d in regions for d in many.decisions.values()
    )


def test_a_checkpointed_call_is_priced_per_tensor_it_saves() -> None:
    # A checkpoint's hooks run once a saved tensor in the forward, in the recomputation
    # and in backward: a call that saves more pays more (region_tensor_seconds, which
    # the Xeon table measured; its calls save from 2 to a block's 9 tensors here).
    from checkpointing._decisions import ALTERNATE, CHOSEN, FULL, SELECTIVE
    from checkpointing.planner._grains import candidates
    from checkpointing.planner._tables import CPU_TABLES

    regions = (FULL, SELECTIVE, ALTERNATE, CHOSEN)
    free, dear, pairs = _priced_free_and_dear("region_tensor_seconds", CPU_TABLES[0].rates)
    names = [name for name, options in candidates(free, selective=True).items() for _ in options]
    saved = {name: len(free.modules[name].packs) for name in names}
    assert len(set(saved.values())) > 1
    for name, (cheap, costly) in zip(names, pairs, strict=True):
        extra = 0.01 * saved[name] if cheap.decision in regions else 0.0
        assert costly.seconds - cheap.seconds == pytest.approx(extra, abs=1e-12)
    assert {cheap.decision for cheap, _ in pairs} >= {FULL, SELECTIVE}
    # Dear saved tensors move the same budget's plan off checkpoints.
    many = plan_checkpointing(_model(), _inputs(), 0.5, rates=free.rates)
    few = plan_checkpointing(_model(), _inputs(), 0.5, rates=dear.rates)
    assert sum(d in regions for d in few.decisions.values()) < sum(
        d in regions for d in many.decisions.values()
    )


def test_a_saved_grain_call_is_priced_with_its_own_cost() -> None:
    from checkpointing._decisions import SAVED

    free, dear, pairs = _priced_free_and_dear("saved_call_seconds")
    for cheap, costly in pairs:
        # Every saved-grain option of a call pays the call's cost once, whatever it
        # drops; no other grain pays it.
        extra = 0.01 if cheap.decision == SAVED else 0.0
        assert costly.seconds - cheap.seconds == pytest.approx(extra, abs=1e-12)
    assert sum(cheap.decision == SAVED for cheap, _ in pairs) > 1
    # A dear call moves the same budget's plan off the saved grain.
    many = plan_checkpointing(_model(), _inputs(), 0.5, rates=free.rates)
    few = plan_checkpointing(_model(), _inputs(), 0.5, rates=dear.rates)
    assert sum(d == SAVED for d in few.decisions.values()) < sum(
        d == SAVED for d in many.decisions.values()
    )


def test_a_selective_policy_is_priced_per_call_the_device_dispatches() -> None:
    # The fake step also records prim queries that a real step answers without a
    # dispatch (a transformer block records more of them than real calls); the policy
    # runs once per real call, so an option pays policy_call_seconds for those only.
    from torch.utils._python_dispatch import TorchDispatchMode

    from checkpointing._decisions import ALTERNATE, CHOSEN, SELECTIVE

    class Count(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            Count.calls += 1
            return func(*args, **(kwargs or {}))

    from checkpointing.planner._grains import candidates

    model, inputs = _model(), _inputs()
    with Count():
        model[0](*inputs)
    recorded = profile_step(_model(), _inputs())
    # Profiled on real tensors (torch 2.4) nothing is dispatched that a step does not.
    prims = any(op.name.startswith("prim.") for op in recorded.modules["0"].ops)
    assert prims == (not recorded.fallback)
    rates = builtin_rates("cpu")
    free, dear = (
        candidates(cost(recorded, dataclasses.replace(rates, policy_call_seconds=s)), True)["0"]
        for s in (0.0, 0.01)
    )
    charged = set()
    for cheap, costly in zip(free, dear, strict=True):
        assert (cheap.decision, cheap.kept) == (costly.decision, costly.kept)
        calls = Count.calls if cheap.decision in (SELECTIVE, ALTERNATE, CHOSEN) else 0
        assert costly.seconds - cheap.seconds == pytest.approx(0.01 * calls, abs=1e-12)
        charged.add(cheap.decision)
    assert {SELECTIVE, CHOSEN} <= charged and Count.calls > 0


def test_a_backward_not_recorded_is_estimated_call_by_call_from_the_forward() -> None:
    # An LSTM runs one real forward (its fused kernel's workspace has no fake size): its
    # backward is two products per product, nothing per random draw, a call per call.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(50, 16), nn.Dropout(0.1), nn.LSTM(16, 16, 2))
    ids = torch.randint(50, (6, 3), generator=torch.Generator().manual_seed(2))
    recorded = profile_step(model, (ids,))
    assert recorded.fallback and not recorded.backward
    rates = builtin_rates("cpu")
    priced = cost(recorded, rates)
    kinds = {w.kind for w in recorded.forward} | {w.random for w in recorded.forward}
    assert {MATMUL, True} <= kinds, "the forward has a product and a random draw"
    backward = 0.0
    for work in recorded.forward:
        forward = op_seconds(work, rates)
        expected = 2.0 * forward if work.kind == MATMUL else 0.0 if work.random else forward
        assert backward_seconds(work, forward) == expected
        backward += expected
    assert priced.step_time == pytest.approx(priced.forward_time + backward, rel=1e-12)
    assert priced.forward_time < backward < 2.0 * priced.forward_time
