"""The offload grain: saved activations in pinned host memory between forward and backward.

On the host backend the grain is never offered (the device is the host) and its wrapper
refuses; those rules, the window, the arguments and the plan file are tested on every
backend. Moving bytes needs a device apart from the host: the openreg cell (streams on
worker threads, walled-off device memory) runs the rest, bit-exact against the plain
model, with the bytes leaving the device, the host buffers reused, and faults clean.
"""

from __future__ import annotations

import copy
import gc
import warnings
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

import checkpointing._activation_offload as activation_offload
from accel import Accelerator
from checkpointing import CheckpointPlan, Decision, DeviceRates, plan_checkpointing
from checkpointing._activation_offload import ActivationOffloadWrapper, host_pool
from checkpointing._decisions import OFFLOADED
from checkpointing.planner import builtin_rates
from checkpointing.planner._grains._offloaded import OFFLOAD, OffloadPayload
from checkpointing.planner._offload_settings import OffloadSettings, window

WIDTH = 256


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)
        self.norm, self.drop = nn.LayerNorm(WIDTH), nn.Dropout(0.1)
        self.fail = ""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.drop(nn.functional.gelu(self.up(x)))
        if self.fail == "forward":
            raise RuntimeError("a failing forward")
        return self.norm(x + self.down(hidden))


def _model(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[Block() for _ in range(4)]).to(device)


def _inputs(device: torch.device) -> tuple[torch.Tensor]:
    return (torch.randn(256, WIDTH, generator=torch.Generator().manual_seed(1)).to(device),)


def _grads(model: nn.Module, inputs: Any, backend: Accelerator, seed: int) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    backend.manual_seed(seed)
    model.zero_grad(set_to_none=True)
    model(*inputs).square().mean().backward()
    return [p.grad.detach().cpu() for p in model.parameters() if p.grad is not None]


def _device_only(backend: Accelerator) -> None:
    if backend.device().type == "cpu":
        pytest.skip(f"{backend.name} computes in host memory: nothing to offload to (openreg)")
    if backend.is_lazy:
        pytest.skip(f"{backend.name} is lazy: a copy to the host would run its graph early")


@pytest.fixture
def device_backend(accel_backend: Accelerator) -> Iterator[Accelerator]:
    _device_only(accel_backend)
    yield accel_backend


def _offload_rates(backend: Accelerator) -> DeviceRates:
    """The device's built-in rates with products at 10 GFLOP/s.

    The test's blocks are small: at a data-centre GPU's rates their forward is a few
    operator calls, shorter than copying their activations, so the search (rightly)
    recomputes them. Priced slower, they take longer to recompute than to copy, as a
    real model's blocks do on a GPU, and the search takes the grain under test.
    """
    return replace(builtin_rates(backend.device_type), matmul_flops=1e10)


def _offload_plan(backend: Accelerator, host_bytes: int = 64 << 20) -> CheckpointPlan:
    device = backend.device()
    return plan_checkpointing(
        _model(device),
        _inputs(device),
        0.5,
        backend=backend,
        offload_activations=True,
        offload_host_bytes=host_bytes,
        rates=_offload_rates(backend),
    )


def test_the_host_backend_never_offers_the_grain_and_says_why() -> None:
    device = torch.device("cpu")
    model, inputs = _model(device), _inputs(device)
    asked = plan_checkpointing(model, inputs, 0.5, backend="cpu", offload_activations=True)
    plain = plan_checkpointing(model, inputs, 0.5, backend="cpu")
    assert OFFLOADED not in asked.decisions.values()
    assert "Offload grain left out: the 'cpu' backend computes in host memory" in asked.note
    assert str(asked).splitlines()[:-1] == str(plain).splitlines()[:-1]
    with pytest.raises(ValueError, match="computes in host memory"):
        ActivationOffloadWrapper(nn.Linear(2, 2), cap_bytes=1, backend="cpu")(
            torch.ones(1, 2, requires_grad=True)
        )


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"offload_host_bytes": 1 << 30}, ValueError, "Pass offload_activations=True too"),
        ({"offload_activations": 1}, TypeError, "must be True or False"),
        ({"offload_activations": True, "offload_host_bytes": -1}, ValueError, "an int of"),
        ({"offload_activations": True, "parameter_reload_bytes": 1.5}, ValueError, "bytes"),
    ],
)
def test_bad_offload_arguments_are_refused_with_a_sentence(
    arguments: dict[str, Any], error: type[Exception], message: str
) -> None:
    device = torch.device("cpu")
    with pytest.raises(error, match=message):
        plan_checkpointing(_model(device), _inputs(device), 0.5, backend="cpu", **arguments)


def test_the_window_hides_copies_only_within_the_calls_compute() -> None:
    streams = OffloadSettings(1 << 30, to_host_bytes=1e9, to_device_bytes=0.5e9, overlapped=True)
    assert window(10**6, 1e-3, streams) == (1e-3, 2e-3, True)
    assert window(10**6, 0.9e-3, streams)[2] is False  # the copy out outlasts the forward
    synchronous = OffloadSettings(1 << 30, 1e9, 1e9, overlapped=False)
    assert window(10**6, 1.0, synchronous)[2] is False  # nothing hides without streams


def test_rates_written_before_the_copy_rates_still_load() -> None:
    old = builtin_rates("cpu").to_dict()
    del old["to_host_bytes"], old["to_device_bytes"]
    assert DeviceRates.from_dict(old) == builtin_rates("cpu")


def test_an_offload_decision_saves_and_loads(tmp_path: Any) -> None:
    device = torch.device("cpu")
    plan = plan_checkpointing(_model(device), _inputs(device), 0.5, backend="cpu")
    payload = OffloadPayload(bytes=1 << 20, copy_seconds=1e-4, host_bytes=1 << 30, min_bytes=1)
    mine = CheckpointPlan(**{**plan.__dict__, "choices": {"0": Decision(OFFLOADED, payload)}})
    mine.save(tmp_path / "plan.json")
    assert CheckpointPlan.load(tmp_path / "plan.json") == mine
    assert OFFLOAD.decode(OFFLOAD.encode(payload)) == payload
    with pytest.raises(ValueError, match="gives no offload payload"):
        OFFLOAD.check("0", None)


def test_a_plan_that_offloads_trains_bit_exact(device_backend: Accelerator) -> None:
    device = device_backend.device()
    plan = _offload_plan(device_backend)
    assert OFFLOADED in plan.decisions.values()
    assert "offload: " in str(plan) and "to pinned host memory" in plan.note
    plain, planned = _model(device), _model(device)
    plan.apply(planned, backend=device_backend)
    for seed in range(3):  # dropout draws the same masks: the forward runs once
        expected = _grads(plain, _inputs(device), device_backend, seed)
        got = _grads(planned, _inputs(device), device_backend, seed)
        assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))


def test_offloaded_bytes_leave_the_device_and_the_host_buffers_are_reused(
    device_backend: Accelerator,
) -> None:
    device = device_backend.device()
    plan = _offload_plan(device_backend)
    sent = sum(d.payload.bytes for d in plan.choices.values() if d.grain == OFFLOADED)
    # The same plan with the offloaded calls left as they are.
    kept = CheckpointPlan(
        **{
            **plan.__dict__,
            "choices": {n: d for n, d in plan.choices.items() if d.grain != OFFLOADED},
        }
    )
    offloaded, keeping = _model(device), _model(device)
    plan.apply(offloaded, backend=device_backend)
    kept.apply(keeping, backend=device_backend)
    _grads(offloaded, _inputs(device), device_backend, 0)  # the pool allocates once
    pool = host_pool(device_backend, 0)
    allocated = pool.allocated_bytes
    measured = plan.measure(offloaded, _inputs(device))
    with warnings.catch_warnings():  # without its offload the plan is over budget
        warnings.simplefilter("ignore", UserWarning)
        without = kept.measure(keeping, _inputs(device)).activation_bytes
    assert without - measured.activation_bytes >= 0.9 * sent > 0
    assert measured.activation_bytes <= measured.estimated_bytes + 0.02 * measured.plain_bytes
    _grads(offloaded, _inputs(device), device_backend, 1)
    gc.collect()
    assert pool.allocated_bytes == allocated and pool.in_use == 0


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_a_fault_leaves_nothing_behind(device_backend: Accelerator, where: str) -> None:
    device = device_backend.device()
    plan = _offload_plan(device_backend)
    plain, planned = _model(device), _model(device)
    plan.apply(planned, backend=device_backend)
    pool = host_pool(device_backend, 0)
    offloaded = [name for name, d in plan.choices.items() if d.grain == OFFLOADED]
    block: Any = planned.get_submodule(offloaded[-1]).module

    def fail(grad: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("a failing backward")

    def failing_step() -> None:
        block.fail = where
        out = planned(*_inputs(device))
        out.register_hook(fail)
        out.square().mean().backward()

    with pytest.raises(RuntimeError, match="a failing") as caught:
        failing_step()
    del caught  # its traceback holds the failed step's frames
    block.fail = ""
    gc.collect()
    assert pool.in_use == 0
    expected = _grads(plain, _inputs(device), device_backend, 5)
    got = _grads(planned, _inputs(device), device_backend, 5)
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))


def test_past_the_cap_it_warns_and_then_recomputes(device_backend: Accelerator) -> None:
    device = device_backend.device()
    torch.manual_seed(0)
    block = Block().to(device)
    plain = copy.deepcopy(block)
    wrapped = ActivationOffloadWrapper(
        copy.deepcopy(block), cap_bytes=0, min_bytes=1, backend=device_backend
    )
    x = _inputs(device)
    with pytest.warns(RuntimeWarning, match="host memory for offloaded activations ran out"):
        first = _grads(wrapped, x, device_backend, 0)
    assert wrapped.fallen_back
    assert all(
        torch.equal(a, b) for a, b in zip(_grads(plain, x, device_backend, 0), first, strict=True)
    )
    second = _grads(wrapped, x, device_backend, 1)  # checkpointed whole now, still exact
    assert all(
        torch.equal(a, b) for a, b in zip(_grads(plain, x, device_backend, 1), second, strict=True)
    )


def test_the_grain_is_offered_where_asked_never_to_the_root() -> None:
    from checkpointing.planner import cost, profile_step
    from checkpointing.planner._options import Call

    device = torch.device("cpu")
    profile = cost(
        profile_step(_model(device), _inputs(device), backend="cpu"), builtin_rates("cpu")
    )
    settings = OffloadSettings(1 << 30, to_host_bytes=1e15, to_device_bytes=1e15, overlapped=True)
    offered = OFFLOAD.options(Call.of(profile, "0", settings))
    assert [o.decision for o in offered] == [OFFLOADED] and offered[0].saved_bytes > 0
    assert offered[0].payload.bytes == offered[0].saved_bytes
    assert OFFLOAD.options(Call.of(profile, "0")) == []  # not asked for
    assert OFFLOAD.options(Call.of(profile, "", settings)) == []  # the root
    slow = OffloadSettings(1 << 30, to_host_bytes=1.0, to_device_bytes=1.0, overlapped=True)
    assert OFFLOAD.options(Call.of(profile, "0", slow)) == []  # outside the window


def test_calibration_times_the_copies_off_the_host_only(accel_backend: Accelerator) -> None:
    from checkpointing.planner._calibration._calibrate import _copy_rates
    from checkpointing.planner._calibration._stopwatch import Sizes

    sizes = Sizes(rounds=2, elements=1 << 16, sample_seconds=1e-4)
    base = builtin_rates(accel_backend.device_type)
    to_host, to_device = _copy_rates(accel_backend, sizes, base)
    if accel_backend.device().type == "cpu" or accel_backend.is_lazy:
        assert (to_host, to_device) == (base.to_host_bytes, base.to_device_bytes)
    else:
        assert 0 < to_host != base.to_host_bytes and 0 < to_device != base.to_device_bytes


def test_the_pool_reuses_by_size_and_lets_other_sizes_go_under_its_cap() -> None:
    import accel
    from checkpointing._activation_offload import HostPool

    pool = HostPool(accel.get_backend("cpu"), cap_bytes=1000)
    first = pool.take(600)
    assert first is not None and pool.take(600) is None  # past the cap
    pool.give(first)
    assert pool.take(600) is first  # reused
    pool.give(first)
    other = pool.take(800)  # the free 600-byte buffer is let go for it
    assert other is not None and pool.allocated_bytes == 800 and pool.in_use == 1


@pytest.fixture
def wrapper_backend(accel_backend: Accelerator, monkeypatch: pytest.MonkeyPatch) -> Accelerator:
    """The backend for wrapper-level tests; on the host, the host declared a device.

    The wrapper then takes the path of a device without streams (plain host memory for
    buffers), so the mechanism's rules run in every cell, not only in openreg's.
    """
    if accel_backend.is_lazy:
        pytest.skip(f"{accel_backend.name} is lazy: a copy to the host would run its graph early")
    if accel_backend.device().type == "cpu":
        monkeypatch.setattr(activation_offload, "refuse_host", lambda backend: None)
        monkeypatch.setattr(activation_offload, "_on_host", lambda tensor: False)
    return accel_backend


class _TiedHead(nn.Module):
    """A head that reads a weight it does not own (tied to an embedding elsewhere)."""

    def __init__(self, weight: nn.Parameter) -> None:
        super().__init__()
        self.tied = [weight]  # not registered: the embedding owns it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(torch.tanh(x), self.tied[0])


def test_a_weight_read_from_elsewhere_is_never_offloaded(wrapper_backend: Accelerator) -> None:
    device = wrapper_backend.device()
    torch.manual_seed(0)
    embedding = nn.Embedding(64, 32).to(device)
    head = ActivationOffloadWrapper(
        _TiedHead(embedding.weight), cap_bytes=1 << 30, min_bytes=1, backend=wrapper_backend
    )
    pool = host_pool(wrapper_backend, 0)
    before = pool.in_use
    x = torch.randn(8, 32, device=device, requires_grad=True)
    out = head(x)
    # linear saved tanh's output (sent) and a transposed view of the tied weight (kept):
    # copying a parameter out and back every step would free nothing.
    assert pool.in_use - before == 1
    out.square().sum().backward()
    want = nn.functional.linear(torch.tanh(x), embedding.weight).square().sum()
    grads = torch.autograd.grad(want, (x, embedding.weight))
    assert x.grad is not None and embedding.weight.grad is not None
    assert torch.equal(x.grad.cpu(), grads[0].cpu())
    assert torch.equal(embedding.weight.grad.cpu(), grads[1].cpu())


def test_a_failed_forward_gives_its_host_buffers_back_at_once(
    wrapper_backend: Accelerator,
) -> None:
    device = wrapper_backend.device()
    torch.manual_seed(0)
    block = Block().to(device)
    plain = copy.deepcopy(block)
    wrapped = ActivationOffloadWrapper(
        block, cap_bytes=1 << 30, min_bytes=1, backend=wrapper_backend
    )
    pool = host_pool(wrapper_backend, 0)
    before = pool.in_use
    x = _inputs(device)
    block.fail = "forward"
    with pytest.raises(RuntimeError, match="a failing forward") as caught:
        wrapped(*x)
    # The traceback still holds the partial graph; its buffers are back in the pool.
    assert caught.value is not None and pool.in_use == before
    block.fail = ""
    expected = _grads(plain, x, wrapper_backend, 3)
    assert all(
        torch.equal(a, b)
        for a, b in zip(expected, _grads(wrapped, x, wrapper_backend, 3), strict=True)
    )
    gc.collect()
    assert pool.in_use == before


class _Scratch(nn.Module):
    """Saves a temporary and drops it; records whether its memory is alive afterwards."""

    def __init__(self) -> None:
        super().__init__()
        self.alive_in_forward: bool | None = None
        self.storage: Any = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scratch = x * 1.5
        out = torch.sin(scratch)  # saves scratch: offloaded, autograd holds a handle
        self.storage = StorageWeakRef(scratch.untyped_storage())
        del scratch
        self.alive_in_forward = not self.storage.expired()
        return torch.exp(out)  # a tensor of the same size: the allocator's next candidate


def test_an_offloaded_storage_lives_to_the_end_of_the_forward(
    wrapper_backend: Accelerator,
) -> None:
    # Copies are matched by storage address: an offloaded storage freed before the
    # call ends could hand its address to the next tensor of its size, which would then
    # come back with the old values (silently wrong gradients, seen without streams).
    device = wrapper_backend.device()
    scratch = _Scratch()
    wrapped = ActivationOffloadWrapper(
        scratch, cap_bytes=1 << 30, min_bytes=1, backend=wrapper_backend
    )
    x = torch.randn(64, 16, device=device, requires_grad=True)
    out = wrapped(x)
    assert scratch.alive_in_forward is True
    assert scratch.storage.expired()  # and freed once the call returned
    (got,) = torch.autograd.grad(out.sum(), x)
    (want,) = torch.autograd.grad(_Scratch()(x).sum(), x)
    assert torch.equal(got.cpu(), want.cpu())
