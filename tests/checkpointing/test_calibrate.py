"""Device rates: built-in, calibrated on request and saved (issue 34).

No test here depends on a timing's value: calibration runs at its smallest sizes, and
only what it returns (positive, finite, the operators a model uses) and what it leaves
as it was are checked.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import accel
import checkpointing
from checkpointing import DeviceRates, calibrate_rates, default_rates
from checkpointing.planner import _default_rates, builtin_rates
from checkpointing.planner._calibration import _calibrate, _operator_rates, _stopwatch

# The smallest calibration: one round, tiny tensors, every call counted however short.
_QUICK = _stopwatch.Sizes(
    rounds=1,
    matmul=32,
    image=4,
    sequence=8,
    elements=1024,
    shapes=1,
    sample_seconds=0.0,
    width=8,
    short_call=0.0,
    evict_ratio=1.0,
)


@pytest.fixture(autouse=True)
def _quick(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The smallest calibration, and a cache directory of the test's own."""
    monkeypatch.setattr(_stopwatch, "SIZES", _QUICK)
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path))


@pytest.fixture(scope="module")
def calibrated() -> DeviceRates:
    """One calibration without a model (not saved), shared by the tests that read it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_stopwatch, "SIZES", _QUICK)
        return calibrate_rates("cpu")


class _Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.norm = nn.BatchNorm1d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = nn.functional.dropout(nn.functional.silu(self.linear(x)), 0.1)
        out: torch.Tensor = self.norm(hidden).softmax(-1)
        return out


def _numbers(rates: DeviceRates) -> list[float]:
    values = rates.to_dict()
    numbers = [v for k, v in values.items() if k not in ("device_type", "source", "operator_bytes")]
    return numbers + list(values["operator_bytes"].values())


def test_calibrate_saves_what_default_rates_reads_back(tmp_path: Path) -> None:
    backend = accel.get_backend()  # what calibrate_rates() takes without a backend
    rates = calibrate_rates(save=True)
    path = _default_rates.rates_cache_path(backend)
    assert path.parent == tmp_path and path.is_file()
    assert json.loads(path.read_text())["format"] == "accel.device-rates/1"
    assert default_rates(backend) == rates
    assert rates.source.startswith("calibrated on ")
    assert rates.device_type == "cpu"


def test_calibrated_rates_are_positive_and_finite(calibrated: DeviceRates) -> None:
    assert all(math.isfinite(v) and v >= 0 for v in _numbers(calibrated))
    for name in ("matmul_flops", "attention_flops", "convolution_flops", "memory_bytes"):
        assert getattr(calibrated, name) > 0
    assert all(v > 0 for v in calibrated.operator_bytes.values())
    # A checkpointed call's own machinery (hundreds of microseconds on a CPU), measured.
    assert 0 < calibrated.region_seconds < 0.1
    # And per tensor a checkpointed call saves (about 12 us here): a difference of two
    # chains, at least 0; its arithmetic is tested with a fixed stopwatch below.
    assert 0 <= calibrated.region_tensor_seconds < 1e-3
    # A saved-grain call's (about 0.16 ms here) is a residual over what the quick
    # calibration's own hook and replay figures price, which its five rounds may
    # overstate: at least 0 here; its arithmetic is tested with a fixed stopwatch below.
    assert 0 <= calibrated.saved_call_seconds < 0.1


def test_calibrate_does_not_save_unless_asked(calibrated: DeviceRates, tmp_path: Path) -> None:
    assert not any(tmp_path.iterdir())


def test_model_calibration_adds_its_operators_and_leaves_the_model_as_it_was() -> None:
    torch.manual_seed(0)
    model = _Small()
    x = torch.randn(4, 8)
    before = {k: v.clone() for k, v in model.state_dict(keep_vars=True).items()}
    grads = [p.grad for p in model.parameters()]
    cpu_state = torch.get_rng_state()
    rates = calibrate_rates("cpu", model=model, example_inputs=(x,))
    assert torch.equal(torch.get_rng_state(), cpu_state)
    after = model.state_dict()
    assert before.keys() == after.keys()
    for name, value in before.items():
        assert torch.equal(value, after[name]), name
        assert value.dtype == after[name].dtype
    assert [p.grad for p in model.parameters()] == grads
    tracked = model.norm.num_batches_tracked
    assert tracked is not None and int(tracked) == 0
    # The model's own operators, forward and backward, get rates of their own.
    for name in (
        "aten.silu.default",
        "aten.silu_backward.default",
        "aten._softmax.default",
        "aten._softmax_backward_data.default",
        "aten.native_batch_norm_backward.default",
    ):
        assert name in rates.operator_bytes, name
    # Dropout's draw keeps the random rate; products keep the flop rate.
    assert "aten.bernoulli_.float" not in rates.operator_bytes
    assert "aten.addmm.default" not in rates.operator_bytes
    assert all(math.isfinite(v) and v >= 0 for v in _numbers(rates))
    assert all(v > 0 for v in rates.operator_bytes.values())


def test_recorded_calls_count_bytes_as_the_cost_model_does() -> None:
    calls = _operator_rates.record_calls(_Small(), (torch.randn(4, 8),))
    silu = [c for c in calls if str(c.func) == "aten.silu.default"]
    assert len(silu) == 1
    assert silu[0].moved == 2 * 4 * 8 * 4  # reads 4 x 8 floats, writes as many
    assert not any("addmm" in str(c.func) or "bernoulli" in str(c.func) for c in calls)
    assert not any(str(c.func) in ("aten.t.default", "aten.view.default") for c in calls)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"backend": 3}, TypeError, "checkpointing: backend must be an accel backend"),
        ({"save": "yes"}, TypeError, "checkpointing: save must be True or False"),
        ({"model": nn.Linear(2, 2)}, ValueError, "was given model without example_inputs"),
        ({"example_inputs": ()}, ValueError, "was given example_inputs without model"),
        (
            {"model": "model", "example_inputs": ()},
            TypeError,
            "calibrate_rates' model must be a torch.nn.Module",
        ),
        (
            {"model": nn.Linear(2, 2), "example_inputs": torch.ones(2)},
            TypeError,
            "example_inputs must be a tuple",
        ),
        (
            {"model": nn.Linear(2, 2).eval(), "example_inputs": (torch.ones(2),)},
            ValueError,
            "model is in evaluation mode",
        ),
        (
            {"model": nn.Linear(2, 2).requires_grad_(False), "example_inputs": (torch.ones(2),)},
            ValueError,
            "no output of the model requires grad",
        ),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, Any], error: type, message: str) -> None:
    with pytest.raises(error, match=message) as raised:
        calibrate_rates(**kwargs)
    assert str(raised.value).startswith("checkpointing: ")
    assert str(raised.value).rstrip().endswith(".")


def test_a_model_that_cannot_run_on_fake_tensors_is_reported() -> None:
    class Routed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.linear(x)[x.sum(-1) > 0]
            return out

    with pytest.raises(RuntimeError, match="checkpointing: calibrate_rates could not run"):
        calibrate_rates("cpu", model=Routed(), example_inputs=(torch.ones(3, 2),))


def test_rates_round_trip_through_a_dictionary(calibrated: DeviceRates) -> None:
    for rates in (builtin_rates("cpu"), builtin_rates("cuda"), calibrated):
        values = json.loads(json.dumps(rates.to_dict()))
        assert DeviceRates.from_dict(values) == rates


@pytest.mark.parametrize("change", ["missing", "unknown"])
def test_from_dict_refuses_missing_and_unknown_fields(change: str) -> None:
    values = builtin_rates("cpu").to_dict()
    if change == "missing":
        del values["hook_seconds"]
    else:
        values["flops"] = 1.0
    with pytest.raises(
        ValueError, match=f"checkpointing: .*{change}: \\['(hook_seconds|flops)'\\]"
    ):
        DeviceRates.from_dict(values)


def test_planning_never_calibrates(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("planning timed the device")

    monkeypatch.setattr(_calibrate, "_measure", refuse)
    monkeypatch.setattr(_stopwatch, "seconds", refuse)
    monkeypatch.setattr(_stopwatch, "best_times", refuse)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.GELU()) for _ in range(4)])
    plan = checkpointing.plan_checkpointing(model, (torch.randn(8, 16),), memory_budget=0.75)
    assert plan.rates == builtin_rates("cpu")


def test_built_in_tables_are_valid() -> None:
    for rates in (builtin_rates("cpu"), builtin_rates("hpu")):
        assert rates.source == "built-in"
        assert all(math.isfinite(v) and v >= 0 for v in _numbers(rates))
    assert builtin_rates("hpu").device_type == "hpu"
    assert dataclasses.replace(builtin_rates("hpu"), device_type="xla") == builtin_rates("xla")


def test_the_cold_stopwatch_clears_the_caches_before_each_sample_on_its_own_arguments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events: list[str] = []
    made: list[list[int]] = []
    stepped: list[list[int]] = []

    def setup() -> list[int]:
        made.append([len(made)])
        events.append("setup")
        return made[-1]

    def step(argument: list[int]) -> None:
        stepped.append(argument)
        events.append("step")

    written: list[int] = []

    def evict(buffer: torch.Tensor) -> None:
        events.append("evict")
        written.append(buffer.numel() * buffer.element_size())

    monkeypatch.setattr(_stopwatch, "_evict", evict)
    sizes = dataclasses.replace(_QUICK, evict_ratio=2.0)
    seconds = _stopwatch.cold_seconds(setup, step, 4096, accel.get_backend("cpu"), sizes)
    assert seconds >= 0.0
    # Twice the call's bytes written before each sample (evict_ratio).
    assert written == [2 * 4096] * _QUICK.rounds
    # One warm-up, then per round: its own arguments made, the caches cleared, one call.
    assert events == ["setup", "step"] + ["setup", "evict", "step"] * _QUICK.rounds
    assert all(a is b for a, b in zip(made, stepped, strict=True))


def test_the_eviction_writes_every_element_of_its_buffer() -> None:
    buffer = torch.zeros(1000)
    _stopwatch._evict(buffer)
    _stopwatch._evict(buffer)
    assert torch.equal(buffer, torch.full((1000,), 2.0))


def test_in_place_operators_are_timed_on_fresh_arguments_and_others_on_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[object] = []
    real = _operator_rates._instantiate

    def counting(*args: Any) -> Any:
        made.append(args)
        return real(*args)

    monkeypatch.setattr(_operator_rates, "_instantiate", counting)
    calls = {str(c.func): c for c in _operator_rates.record_calls(_Small(), (torch.randn(4, 8),))}
    backend = accel.get_backend("cpu")
    sizes = dataclasses.replace(_QUICK, rounds=3)
    for name, instances in (("aten.div_.Scalar", 1 + sizes.rounds), ("aten.silu.default", 1)):
        made.clear()
        timed = _operator_rates._time_call(calls[name], torch.device("cpu"), backend, sizes)
        assert timed is not None and len(made) == instances, name


def test_a_rate_comes_only_from_calls_whose_bytes_matter(monkeypatch: pytest.MonkeyPatch) -> None:
    # An in-place add timed on a scalar takes its fixed cost whatever its bytes: a rate
    # taken from it (bytes over seconds) would price a large add thousands of times too
    # high. Such a call gives no rate; a large one of the same operator does.
    class Adds(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            small = x.sum().reshape(1)
            small.add_(1.0)
            return small + x.mean()

    calls = _operator_rates.record_calls(Adds(), (torch.randn(4, 8, requires_grad=True),))
    monkeypatch.setattr(_operator_rates, "_time_call", lambda *args: 1e-3)
    backend = accel.get_backend("cpu")
    sizes = dataclasses.replace(_QUICK, short_call=2.0)
    rates = _operator_rates.model_operator_rates(calls, backend, 1e-6, 1e9, sizes)
    assert "aten.add_.Tensor" not in rates
    # At a default rate slow enough that its bytes outweigh the fixed cost, it has one.
    slow = _operator_rates.model_operator_rates(calls, backend, 1e-6, 1.0, sizes)
    assert "aten.add_.Tensor" in slow


def test_operators_that_share_their_arguments_are_each_timed_as_themselves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A tanh and a sigmoid of one tensor have the same arguments. Until 2026-12-04 the
    # first operator recorded with them was timed for both, so tanh, a quarter of a
    # sigmoid's speed on a Zen 5 host, got the sigmoid's rate.
    class Pair(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.sigmoid(x) + torch.tanh(x)

    calls = _operator_rates.record_calls(Pair(), (torch.randn(64, 64, requires_grad=True),))
    timed: list[str] = []

    def stopwatch(call: Any, *args: Any) -> float:
        timed.append(str(call.func))
        return 4e-3 if "tanh" in str(call.func) else 1e-3

    monkeypatch.setattr(_operator_rates, "_time_call", stopwatch)
    rates = _operator_rates.model_operator_rates(
        calls, accel.get_backend("cpu"), 1e-6, 1e9, dataclasses.replace(_QUICK, short_call=2.0)
    )
    assert "aten.tanh.default" in timed and "aten.sigmoid.default" in timed
    assert rates["aten.sigmoid.default"] == pytest.approx(4 * rates["aten.tanh.default"], rel=0.01)


def test_a_saved_grain_calls_cost_is_what_its_blocks_add_beyond_their_prices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from checkpointing.planner._calibration import _saved_machinery

    # A stopwatch that says the eight planned blocks take one second more than plain.
    monkeypatch.setattr(_saved_machinery, "best_times", lambda steps, *_: [0.5, 1.5])
    backend, rates = accel.get_backend("cpu"), builtin_rates("cpu")
    free = _saved_machinery._call_seconds(backend, _QUICK, rates, hook=0.0, replay=0.0)
    # Less only the replayed calls' own prices: microseconds of eight small drops.
    assert 1 / 8 - 1e-3 < free < 1 / 8
    hooked = _saved_machinery._call_seconds(backend, _QUICK, rates, hook=0.01, replay=0.0)
    replayed = _saved_machinery._call_seconds(backend, _QUICK, rates, hook=0.0, replay=0.01)
    # Each block pays its hooks per saved tensor (several) and one replayed step at least.
    assert hooked < free - 0.01 * 2 and replayed <= free - 0.01 + 1e-9
    # Never below 0, whatever the prices.
    assert _saved_machinery._call_seconds(backend, _QUICK, rates, hook=1.0, replay=0.0) == 0.0


def test_a_checkpoints_cost_is_split_into_one_per_call_and_one_per_saved_tensor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from checkpointing.planner._calibration import _overheads

    # A stopwatch under which a checkpointed call costs 0.2 ms plus 12 us a saved tensor.
    def region_seconds(backend: Any, sizes: Any, depth: int) -> float:
        return 2e-4 + 12e-6 * depth

    monkeypatch.setattr(_overheads, "_region_seconds", region_seconds)
    per_call, per_tensor = _overheads.region_overhead(accel.get_backend("cpu"), _QUICK)
    assert per_call == pytest.approx(2e-4) and per_tensor == pytest.approx(12e-6)
    # A deeper chain that measures less than the shallow one is noise: no tensor cost.
    monkeypatch.setattr(_overheads, "_region_seconds", lambda b, s, depth: 5e-4 - 1e-6 * depth)
    assert _overheads.region_overhead(accel.get_backend("cpu"), _QUICK) == (
        pytest.approx(4.98e-4),
        0.0,
    )


def test_the_chains_calls_save_as_many_tensors_as_they_are_deep() -> None:
    from checkpointing.planner import profile_step
    from checkpointing.planner._calibration import _overheads

    for depth in (_overheads._SHALLOW, _overheads._DEEP):
        model = nn.Sequential(_overheads._Small(depth))
        recorded = profile_step(model, (torch.ones(4, 8, requires_grad=True),))
        assert len(recorded.modules["0"].packs) == depth
