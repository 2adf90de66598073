"""Tests of backends/hpu.py against the habana_frameworks double (tests/doubles).

Availability is tested in test_hpu_probe.py, the bridge's side effects in
test_hpu_bridge.py.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest
import torch

import accel
from backends.hpu import HpuBackend


def _hpu() -> HpuBackend:
    backend = accel.get_backend("hpu")
    assert isinstance(backend, HpuBackend)
    return backend


# Lazy and eager mode ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lazy_mode", "expected_lazy"),
    [("1", True), ("0", False), (None, False)],
    ids=["PT_HPU_LAZY_MODE=1", "PT_HPU_LAZY_MODE=0", "unset"],
)
def test_mark_step_follows_the_bridge_lazy_mode(
    habana_double: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    lazy_mode: str | None,
    expected_lazy: bool,
) -> None:
    if lazy_mode is not None:
        monkeypatch.setenv("PT_HPU_LAZY_MODE", lazy_mode)
    backend = _hpu()
    assert backend.is_lazy is expected_lazy
    assert habana_double.call_args("utils.internal.is_lazy") == [()]

    backend.mark_step()

    expected = [("", False)] if expected_lazy else []
    assert habana_double.call_args("core.mark_step") == expected


@pytest.mark.parametrize(
    ("lazy_mode", "expected_lazy"),
    [("1", True), ("0", False), (None, True)],
    ids=["PT_HPU_LAZY_MODE=1", "PT_HPU_LAZY_MODE=0", "unset-defaults-to-lazy"],
)
def test_old_bridge_without_is_lazy_reads_the_variable_defaulting_to_lazy(
    habana_double: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    lazy_mode: str | None,
    expected_lazy: bool,
) -> None:
    habana_double.RELEASE_LAZY_DEFAULT = "1"  # as in the releases without is_lazy()
    internal = importlib.import_module("habana_frameworks.torch.utils.internal")
    monkeypatch.delattr(internal, "is_lazy")
    if lazy_mode is not None:
        monkeypatch.setenv("PT_HPU_LAZY_MODE", lazy_mode)
    backend = _hpu()
    assert backend.is_lazy is expected_lazy

    backend.mark_step()
    backend.mark_step()

    assert len(habana_double.call_args("core.mark_step")) == (2 if expected_lazy else 0)


def test_lazy_mode_is_read_once_at_construction(
    habana_double: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    backend = _hpu()
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    backend.mark_step()
    assert habana_double.call_args("core.mark_step") == [("", False)]
    assert "lazy" in repr(backend)


# RNG ----------------------------------------------------------------------------------


def test_rng_state_uses_device_index_zero(habana_double: ModuleType) -> None:
    backend = _hpu()
    state = backend.get_rng_state()
    backend.set_rng_state(state)

    assert habana_double.call_args("hpu.random.get_rng_state") == [(0,)]
    [(passed_state, device)] = habana_double.call_args("hpu.random.set_rng_state")
    assert passed_state is state
    assert device == 0


def test_rng_state_round_trips(habana_double: ModuleType) -> None:
    backend = _hpu()
    backend.manual_seed(1234)
    assert habana_double.call_args("hpu.random.manual_seed") == [(1234,)]
    state = backend.get_rng_state()
    assert state.dtype == torch.uint8

    backend.manual_seed(99)
    assert not torch.equal(backend.get_rng_state(), state)

    backend.set_rng_state(state)
    assert torch.equal(backend.get_rng_state(), state)


def test_double_refuses_other_device_indices_like_the_bridge(habana_double: ModuleType) -> None:
    random = importlib.import_module("habana_frameworks.torch.hpu.random")
    with pytest.raises(RuntimeError, match="supports only device 0"):
        random.get_rng_state(1)
    with pytest.raises(RuntimeError, match="supports only device 0"):
        random.get_rng_state("hpu:1")
    assert random.get_rng_state("hpu:0").dtype == torch.uint8


@pytest.fixture
def seeded_cpu_rng() -> Iterator[None]:
    saved = torch.get_rng_state()
    torch.manual_seed(0)
    yield
    torch.set_rng_state(saved)


def test_fork_rng_restores_cpu_and_hpu_generators(
    habana_double: ModuleType, seeded_cpu_rng: None
) -> None:
    backend = _hpu()
    cpu_before = torch.get_rng_state()
    hpu_before = backend.get_rng_state()

    with backend.fork_rng():
        torch.rand(8)
        backend.manual_seed(7)
        assert not torch.equal(torch.get_rng_state(), cpu_before)
        assert not torch.equal(backend.get_rng_state(), hpu_before)

    assert torch.equal(torch.get_rng_state(), cpu_before)
    assert torch.equal(backend.get_rng_state(), hpu_before)


def test_fork_rng_restores_both_generators_when_the_block_raises(
    habana_double: ModuleType, seeded_cpu_rng: None
) -> None:
    backend = _hpu()
    cpu_before = torch.get_rng_state()
    hpu_before = backend.get_rng_state()

    with pytest.raises(KeyError, match="boom"), backend.fork_rng():
        torch.rand(8)
        backend.manual_seed(7)
        raise KeyError("boom")

    assert torch.equal(torch.get_rng_state(), cpu_before)
    assert torch.equal(backend.get_rng_state(), hpu_before)


def test_fork_rng_disabled_restores_nothing(
    habana_double: ModuleType, seeded_cpu_rng: None
) -> None:
    backend = _hpu()
    cpu_before = torch.get_rng_state()
    hpu_before = backend.get_rng_state()
    habana_double.CALLS.clear()

    with backend.fork_rng(enabled=False):
        torch.rand(8)
        backend.manual_seed(7)
        cpu_inside = torch.get_rng_state()
        hpu_inside = backend.get_rng_state()

    assert not torch.equal(cpu_inside, cpu_before)
    assert not torch.equal(hpu_inside, hpu_before)
    assert torch.equal(torch.get_rng_state(), cpu_inside)
    assert torch.equal(backend.get_rng_state(), hpu_inside)
    assert habana_double.call_args("hpu.random.set_rng_state") == []


# Autocast -----------------------------------------------------------------------------


def test_autocast_kwargs_outside_autocast(habana_double: ModuleType) -> None:
    kwargs = _hpu().autocast_kwargs()
    assert kwargs["device_type"] == "hpu"
    assert kwargs["enabled"] is False
    assert "cache_enabled" not in kwargs
    assert set(kwargs) == {"device_type", "enabled", "dtype"}


def test_autocast_kwargs_inside_hpu_autocast_and_replay(habana_double: ModuleType) -> None:
    backend = _hpu()
    with torch.autocast("hpu", dtype=torch.bfloat16):
        kwargs = backend.autocast_kwargs()
    assert kwargs == {"device_type": "hpu", "enabled": True, "dtype": torch.bfloat16}

    assert not torch.is_autocast_enabled("hpu")
    with torch.autocast(**kwargs):
        assert torch.is_autocast_enabled("hpu")
        assert torch.get_autocast_dtype("hpu") == torch.bfloat16
        assert backend.autocast_kwargs() == kwargs
    assert not torch.is_autocast_enabled("hpu")


# Distributed --------------------------------------------------------------------------


def test_hccl_is_registered_when_the_backend_is_created(habana_double: ModuleType) -> None:
    # The bridge imports distributed.hccl with itself, so its environment writes happen
    # at creation, not in prepare_distributed() (issue 10, item 3).
    assert "habana_frameworks.torch.distributed.hccl" not in sys.modules
    backend = _hpu()
    assert backend.communication_backend == "hccl"
    assert habana_double.call_names().count("hccl.import") == 1
    assert "hccl" in torch.distributed.Backend.backend_list

    backend.prepare_distributed()
    backend.prepare_distributed()

    assert habana_double.call_names().count("hccl.import") == 1


# Devices ------------------------------------------------------------------------------


def test_device_is_hpu_zero(habana_double: ModuleType) -> None:
    backend = _hpu()
    assert backend.device() == torch.device("hpu", 0)
    assert backend.device(0) == torch.device("hpu", 0)
    assert backend.current_device() == 0
    backend.set_device(0)


@pytest.mark.parametrize("call", ["device", "set_device"])
@pytest.mark.parametrize("index", [1, -1, True])
def test_other_device_indices_raise_with_the_one_device_hint(
    habana_double: ModuleType, call: str, index: int
) -> None:
    backend = _hpu()
    with pytest.raises(accel.DeviceIndexError) as excinfo:
        getattr(backend, call)(index)
    message = str(excinfo.value)
    assert "one device per process" in message
    assert "HABANA_VISIBLE_MODULES" in message
    assert repr(index) in message


@pytest.mark.parametrize("cards", [1, 8])
def test_device_count_is_one_per_process_and_every_index_below_it_works(
    habana_double: ModuleType, cards: int
) -> None:
    # The bridge counts every card on the node; a process uses one (issue 10, item 4).
    habana_double.DEVICE_COUNT = cards
    backend = _hpu()
    assert backend.device_count() == 1
    assert [backend.device(i) for i in range(backend.device_count())] == [torch.device("hpu", 0)]
    for index in range(backend.device_count()):
        backend.set_device(index)
    assert backend.is_available() is True
    assert "hpu.device_count" not in habana_double.call_names()
    assert habana_double.DEVICE_ACQUIRED is False


def test_device_count_is_zero_when_the_bridge_sees_no_card(habana_double: ModuleType) -> None:
    backend = _hpu()
    habana_double.DEVICE_COUNT = 0
    assert backend.device_count() == 0
    assert backend.is_available() is False


def test_synchronize_delegates(habana_double: ModuleType) -> None:
    _hpu().synchronize()
    assert habana_double.call_names().count("hpu.synchronize") == 1


def test_backend_satisfies_the_protocol(habana_double: ModuleType) -> None:
    backend = _hpu()
    assert isinstance(backend, accel.Accelerator)
    assert list(accel._protocol.iter_missing_members(backend)) == []
    assert backend.name == "hpu"
    assert backend.device_type == "hpu"
    assert backend.is_asynchronous is True
    assert backend.supports_streams is True
    assert backend.supports_memory_stats is True


# Streams and events -------------------------------------------------------------------


def test_streams_and_events_come_from_the_bridge(habana_double: ModuleType) -> None:
    hpu = importlib.import_module("habana_frameworks.torch.hpu")
    backend = _hpu()
    assert backend.Stream is hpu.Stream
    assert backend.Event is hpu.Event

    stream = backend.Stream()
    event = backend.Event()
    assert isinstance(stream, accel.Stream)
    assert isinstance(event, accel.Event)
    assert habana_double.call_args("hpu.Stream") == [(None, 0)]
    assert habana_double.call_args("hpu.Event") == [(False,)]


def test_stream_context_switches_the_current_stream(habana_double: ModuleType) -> None:
    backend = _hpu()
    default = backend.current_stream()
    assert default is not None
    side = backend.Stream()
    assert side != default

    with backend.stream(side):
        assert backend.current_stream() == side
    assert backend.current_stream() == default
    assert habana_double.call_args("hpu.stream") == [(side,)]


@pytest.mark.parametrize(("lazy", "same_object"), [("0", False), ("1", True)])
def test_current_stream_is_a_new_object_per_call_in_eager_mode(
    habana_double: ModuleType, monkeypatch: pytest.MonkeyPatch, lazy: str, same_object: bool
) -> None:
    # Code that compares streams with `is` works in lazy mode only; compare with ==.
    monkeypatch.setenv("PT_HPU_LAZY_MODE", lazy)
    backend = _hpu()
    first, second = backend.current_stream(), backend.current_stream()
    assert first == second
    assert (first is second) is same_object


def test_stream_and_event_methods_reach_the_bridge(habana_double: ModuleType) -> None:
    backend = _hpu()
    side = backend.Stream()
    side.wait_stream(backend.current_stream())
    event = side.record_event()
    assert isinstance(event, backend.Event)
    backend.current_stream().wait_event(event)
    event.wait()
    assert event.query() is True
    assert side.query() is True
    event.synchronize()
    side.synchronize()

    names = habana_double.call_names()
    for name in (
        "hpu.Stream.wait_stream",
        "hpu.Stream.record_event",
        "hpu.Event.record",
        "hpu.Stream.wait_event",
        "hpu.Event.wait",
        "hpu.Event.query",
        "hpu.Stream.query",
        "hpu.Event.synchronize",
        "hpu.Stream.synchronize",
    ):
        assert names.count(name) == 1, name
    assert habana_double.call_args("hpu.Event.record") == [(side,)]


# Memory and dtypes --------------------------------------------------------------------


def test_memory_stats_delegate(habana_double: ModuleType) -> None:
    backend = _hpu()
    habana_double.MEMORY_ALLOCATED = 1024
    habana_double.MAX_MEMORY_ALLOCATED = 4096
    assert backend.memory_allocated() == 1024
    assert backend.max_memory_allocated() == 4096

    backend.reset_peak_memory_stats()

    assert habana_double.call_names().count("hpu.reset_peak_memory_stats") == 1
    assert backend.max_memory_allocated() == 1024


def test_empty_cache_is_a_no_op(habana_double: ModuleType) -> None:
    backend = _hpu()
    habana_double.CALLS.clear()
    backend.empty_cache()
    assert habana_double.CALLS == []


@pytest.mark.parametrize("supported", [True, False])
def test_fp16_support_follows_the_bridge(habana_double: ModuleType, supported: bool) -> None:
    habana_double.FP16_SUPPORTED = supported
    backend = _hpu()
    assert backend.is_fp16_supported() is supported
    assert habana_double.call_names().count("utils.experimental._is_fp16_supported") == 1
    assert backend.is_bf16_supported() is True


def test_fp16_unsupported_when_the_bridge_cannot_tell(
    habana_double: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    experimental = importlib.import_module("habana_frameworks.torch.utils.experimental")
    monkeypatch.delattr(experimental, "_is_fp16_supported")
    assert _hpu().is_fp16_supported() is False


def test_is_available_is_false_when_the_bridge_raises(
    habana_double: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = _hpu()

    def broken() -> bool:
        raise RuntimeError("driver not loaded")

    monkeypatch.setattr(sys.modules["habana_frameworks.torch.hpu"], "is_available", broken)
    assert backend.is_available() is False
    assert backend.device_count() == 0


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_lazy_gaudi_cuts_every_training_step_at_the_same_places(
    habana_double: ModuleType, monkeypatch: pytest.MonkeyPatch, reentrant: bool
) -> None:
    # A lazy runtime compiles each distinct graph between two flushes once and reuses
    # it; a flush that moves or multiplies from one step to the next recompiles every
    # step (on XLA, measured with CompileTime in test_xla_device.py).
    from torch import nn

    from checkpointing import apply_activation_checkpointing
    from offload import Engine

    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    backend = accel.get_backend("hpu")
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)),
        nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)),
    )
    apply_activation_checkpointing(model, use_reentrant=reentrant, backend=backend)
    engine = Engine(model, torch.optim.SGD(model.parameters(), lr=0.1), backend=backend)
    x = torch.randn(3, 4, requires_grad=True)
    watched = ("core.mark_step", "hpu.random.get_rng_state", "hpu.random.set_rng_state")
    steps = []
    for _ in range(3):
        habana_double.CALLS.clear()
        engine.backward(model(x).pow(2).sum())
        engine.step()
        steps.append([name for name in habana_double.call_names() if name in watched])
    assert steps[0] == steps[1] == steps[2], steps
    # One flush before each of the two recomputations, one after backward, one after
    # the optimizer step.
    assert steps[0].count("core.mark_step") == 4, steps[0]
