"""Tests of backends/hpu.py against the habana_frameworks double (tests/doubles)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

import accel
import backends.hpu
from backends.hpu import HpuBackend

DOUBLES_DIR = Path(__file__).resolve().parents[1] / "doubles"
REPO_ROOT = Path(__file__).resolve().parents[2]


def _hpu() -> HpuBackend:
    backend = accel.get_backend("hpu")
    assert isinstance(backend, HpuBackend)
    return backend


def _vendor_modules() -> list[str]:
    return sorted(
        name
        for name in sys.modules
        if name == "habana_frameworks" or name.startswith("habana_frameworks.")
    )


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


def test_prepare_distributed_imports_hccl_once(habana_double: ModuleType) -> None:
    backend = _hpu()
    assert backend.communication_backend == "hccl"
    assert "habana_frameworks.torch.distributed.hccl" not in sys.modules

    backend.prepare_distributed()
    backend.prepare_distributed()

    assert "habana_frameworks.torch.distributed.hccl" in sys.modules
    assert habana_double.call_names().count("hccl.import") == 1
    assert "hccl" in torch.distributed.Backend.backend_list


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


@pytest.mark.parametrize("count", [0, 1, 8])
def test_device_count_and_is_available_delegate(habana_double: ModuleType, count: int) -> None:
    backend = _hpu()
    habana_double.DEVICE_COUNT = count
    assert backend.device_count() == count
    assert backend.is_available() is (count > 0)
    assert habana_double.call_names()[-2:] == ["hpu.device_count", "hpu.is_available"]


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
    assert side is not default

    with backend.stream(side):
        assert backend.current_stream() is side
    assert backend.current_stream() is default
    assert habana_double.call_args("hpu.stream") == [(side,)]


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


# No process-wide side effects ---------------------------------------------------------


class _WriteRecordingEnviron(dict[str, str]):
    """Stands in for os.environ and records every write, even one that changes nothing."""

    def __init__(self, initial: dict[str, str]) -> None:
        super().__init__(initial)
        self.writes: list[str] = []

    def __setitem__(self, key: str, value: str) -> None:
        self.writes.append(f"set {key}")
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self.writes.append(f"del {key}")
        super().__delitem__(key)

    def setdefault(self, key: str, default: str = "") -> str:  # type: ignore[override]
        self.writes.append(f"setdefault {key}")
        return super().setdefault(key, default)

    def update(self, *args: object, **kwargs: str) -> None:  # type: ignore[override]
        self.writes.append("update")
        super().update(*args, **kwargs)  # type: ignore[arg-type]

    def pop(self, key: str, *default: str) -> str:  # type: ignore[override]
        self.writes.append(f"pop {key}")
        return super().pop(key, *default)

    def clear(self) -> None:
        self.writes.append("clear")
        super().clear()


@pytest.mark.parametrize("deterministic", [False, True])
def test_using_the_backend_changes_no_process_setting(
    habana_double: ModuleType, monkeypatch: pytest.MonkeyPatch, deterministic: bool
) -> None:
    previous = torch.are_deterministic_algorithms_enabled()
    # Before os.environ is replaced: its first call imports torch._inductor, which writes
    # TORCHINDUCTOR_CACHE_DIR.
    torch.use_deterministic_algorithms(deterministic)
    try:
        environ = _WriteRecordingEnviron(dict(os.environ))
        monkeypatch.setattr(os, "environ", environ)
        putenv_calls: list[tuple[str, ...]] = []
        monkeypatch.setattr(os, "putenv", lambda *args: putenv_calls.append(args))
        monkeypatch.setattr(os, "unsetenv", lambda *args: putenv_calls.append(args))
        environ_before = dict(environ)
        dtype_before = torch.get_default_dtype()

        backend = _hpu()
        backend.mark_step()
        backend.prepare_distributed()

        assert torch.are_deterministic_algorithms_enabled() is deterministic
        assert dict(environ) == environ_before
        assert environ.writes == []
        assert putenv_calls == []
        assert torch.get_default_dtype() == dtype_before
    finally:
        torch.use_deterministic_algorithms(previous)


# Availability and selection -----------------------------------------------------------


def test_missing_package_makes_hpu_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        sys, "path", [entry for entry in sys.path if Path(entry or ".").resolve() != DOUBLES_DIR]
    )
    for name in _vendor_modules():
        monkeypatch.delitem(sys.modules, name)
    importlib.invalidate_caches()
    accel.reset_backends()

    with pytest.raises(accel.BackendUnavailableError) as excinfo:
        accel.get_backend("hpu")

    message = str(excinfo.value)
    assert "habana_frameworks is not installed" in message
    assert "Available: cpu" in message
    assert _vendor_modules() == []


def test_package_without_device_nodes_makes_hpu_unavailable(
    habana_double: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    empty = tmp_path / "no-devices"
    empty.mkdir()
    monkeypatch.setattr(backends.hpu, "DEVICE_NODE_GLOBS", (str(empty / "accel[0-9]*"),))
    accel.reset_backends()

    with pytest.raises(accel.BackendUnavailableError) as excinfo:
        accel.get_backend("hpu")

    message = str(excinfo.value)
    assert "habana_frameworks is installed but no Gaudi device node" in message
    assert "Available: cpu" in message
    assert "habana_frameworks.torch" not in sys.modules
    assert accel.select_backend() == accel.Selection("cpu", "fallback")


def test_auto_detection_picks_hpu_when_a_device_node_exists(habana_double: ModuleType) -> None:
    assert accel.select_backend() == accel.Selection("hpu", "auto")
    backend = accel.get_backend()
    assert isinstance(backend, HpuBackend)
    assert backend is accel.get_backend("hpu")

    [row] = [info for info in accel.list_backends() if info.name == "hpu"]
    assert row.available is True
    assert row.device_count == 1


_HYGIENE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import backends.hpu

    def vendor():
        return sorted(m for m in sys.modules if m.split(".")[0] == "habana_frameworks")

    backends.hpu.DEVICE_NODE_GLOBS = (sys.argv[1],)
    import accel
    result = {"after_import": vendor()}
    rows = {row.name: row.available for row in accel.list_backends()}
    result["list_hpu_available"] = rows["hpu"]
    result["after_list"] = vendor()
    result["picked"] = accel.get_backend().name
    result["after_get_backend"] = vendor()

    backends.hpu.DEVICE_NODE_GLOBS = (sys.argv[2],)
    accel.reset_backends()
    rows = {row.name: row.available for row in accel.list_backends()}
    result["list_hpu_available_with_nodes"] = rows["hpu"]
    result["after_list_with_nodes"] = vendor()
    print(json.dumps(result))
    """
)


def test_probing_imports_nothing_of_habana_frameworks(tmp_path: Path) -> None:
    no_nodes = tmp_path / "none"
    no_nodes.mkdir()
    nodes = tmp_path / "nodes"
    nodes.mkdir()
    (nodes / "accel0").touch()
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("ACCEL") and key != "PT_HPU_LAZY_MODE"
    }
    env["PYTHONPATH"] = os.pathsep.join(
        [str(DOUBLES_DIR), str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )

    completed = subprocess.run(
        [
            sys.executable,
            "-c",
            _HYGIENE_SCRIPT,
            str(no_nodes / "accel[0-9]*"),
            str(nodes / "accel[0-9]*"),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    result = json.loads(completed.stdout.strip().splitlines()[-1])

    assert result == {
        "after_import": [],
        "list_hpu_available": False,
        "after_list": [],
        "picked": "cpu",
        "after_get_backend": [],
        "list_hpu_available_with_nodes": True,
        "after_list_with_nodes": [],
    }


def test_is_available_is_false_when_the_bridge_raises(
    habana_double: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = _hpu()

    def broken() -> bool:
        raise RuntimeError("driver not loaded")

    monkeypatch.setattr(sys.modules["habana_frameworks.torch.hpu"], "is_available", broken)
    assert backend.is_available() is False
