"""accel.distributed.init_process_group, and training with our checkpoint on two processes.

Unit tests (no processes): every error, and what is passed to
``torch.distributed.init_process_group`` (replaced by a recorder), with the environment
set by monkeypatch. One test starts a real single-process gloo group.

Two-process tests on cpu (gloo), launched the way users launch them:
``python -m torch.distributed.run --nproc_per_node=2 --master_port=<free port> script.py``
with the scripts in ``distributed_scripts/``, each bounded by ``TIMEOUT_S``. The scripts
save their results with ``torch.save``; the comparisons are made here.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed as dist

import accel
import accel.distributed
from accel import AccelError, _select
from accel._compat import FSDP2_MIN_RELEASE_OFF_CUDA, fsdp2_fully_shard, torch_release
from accel.distributed import DistributedSetupError
from backends._common import checked_index
from backends.cpu import CpuBackend
from backends.recording import RecordingBackend

TIMEOUT_S = 300  # a hang guard, generous for a loaded 2-core CI machine
REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "distributed_scripts"
TORCHRUN_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "GROUP_RANK",
    "ROLE_RANK",
    "TORCHELASTIC_RUN_ID",
)


# Fixtures and doubles -------------------------------------------------------------------


@dataclass
class FakeInit:
    """Stands in for torch.distributed.init_process_group and is_initialized."""

    calls: list[dict[str, Any]] = field(default_factory=list)
    initialized: bool = False

    def init_process_group(self, **kwargs: Any) -> None:
        self.calls.append(kwargs)
        self.initialized = True

    def is_initialized(self) -> bool:
        return self.initialized

    @property
    def only_call(self) -> dict[str, Any]:
        assert len(self.calls) == 1, self.calls
        return self.calls[0]


@pytest.fixture
def fake_init(monkeypatch: pytest.MonkeyPatch) -> FakeInit:
    fake = FakeInit()
    monkeypatch.setattr(dist, "init_process_group", fake.init_process_group)
    monkeypatch.setattr(dist, "is_initialized", fake.is_initialized)
    return fake


@pytest.fixture
def torchrun_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The environment torchrun gives rank 1 of 2 on one node; returns monkeypatch to edit it."""
    for name in TORCHRUN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in {
        "RANK": "1",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }.items():
        monkeypatch.setenv(name, value)
    return monkeypatch


class MultiDeviceBackend(CpuBackend):
    """A cpu backend that claims ``count`` devices, every index usable (like cuda)."""

    def __init__(self, count: int) -> None:
        self.count = count

    def device_count(self) -> int:
        return self.count

    def device(self, index: int | None = None) -> torch.device:
        if index is not None:
            checked_index(self.name, index, self.count)
        return torch.device("cpu")

    def set_device(self, index: int) -> None:
        checked_index(self.name, index, self.count)


def _recording(inner: Any = None) -> RecordingBackend:
    return RecordingBackend(CpuBackend() if inner is None else inner)


def _set_device_calls(backend: RecordingBackend) -> list[tuple[Any, ...]]:
    return [call.args for call in backend.calls if call.name == "set_device"]


# What is passed to torch --------------------------------------------------------------


def test_cpu_under_torchrun_env(fake_init: FakeInit, torchrun_env: pytest.MonkeyPatch) -> None:
    backend = _recording()

    returned = accel.distributed.init_process_group(accel_backend=backend)

    assert returned is backend
    call = fake_init.only_call
    assert call["backend"] == "gloo"
    assert (call["rank"], call["world_size"]) == (1, 2)
    assert call["init_method"] is None and call["timeout"] is None and call["store"] is None
    # cpu has one device, shared by the local processes: LOCAL_RANK=1 binds index 0.
    assert _set_device_calls(backend) == [(0,)]
    backend.assert_order("prepare_distributed", "set_device")


def test_default_backend_is_get_backend(
    fake_init: FakeInit, torchrun_env: pytest.MonkeyPatch
) -> None:
    torchrun_env.setenv("ACCEL", "cpu")

    returned = accel.distributed.init_process_group()

    assert returned is accel.get_backend()
    assert fake_init.only_call["backend"] == "gloo"


def test_arguments_are_passed_on(fake_init: FakeInit, torchrun_env: pytest.MonkeyPatch) -> None:
    timeout = timedelta(seconds=7)
    accel.distributed.init_process_group(
        "cpu:gloo",
        "tcp://10.0.0.1:1234",
        timeout,
        accel_backend=_recording(),
        group_name="trainers",
        device_id=None,
    )
    assert fake_init.only_call == {
        "backend": "cpu:gloo",
        "init_method": "tcp://10.0.0.1:1234",
        "timeout": timeout,
        "world_size": 2,
        "rank": 1,
        "store": None,
        "group_name": "trainers",
        "device_id": None,
    }


def test_explicit_rank_and_world_size_win_over_the_environment(
    fake_init: FakeInit, torchrun_env: pytest.MonkeyPatch
) -> None:
    backend = _recording()
    accel.distributed.init_process_group(accel_backend=backend, rank=3, world_size=4, local_rank=0)
    call = fake_init.only_call
    assert (call["rank"], call["world_size"]) == (3, 4)
    assert _set_device_calls(backend) == [(0,)]


def test_single_process_needs_no_local_rank(
    fake_init: FakeInit, torchrun_env: pytest.MonkeyPatch
) -> None:
    for name in ("LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        torchrun_env.delenv(name)
    torchrun_env.setenv("RANK", "0")
    torchrun_env.setenv("WORLD_SIZE", "1")
    backend = _recording()
    accel.distributed.init_process_group(accel_backend=backend)
    assert (fake_init.only_call["rank"], fake_init.only_call["world_size"]) == (0, 1)
    assert _set_device_calls(backend) == [(0,)]


@pytest.mark.parametrize("init_method", ["tcp://127.0.0.1:29500", "file:///tmp/rendezvous"])
def test_rendezvous_other_than_env_needs_no_master(
    fake_init: FakeInit, torchrun_env: pytest.MonkeyPatch, init_method: str
) -> None:
    torchrun_env.delenv("MASTER_ADDR")
    torchrun_env.delenv("MASTER_PORT")
    accel.distributed.init_process_group(init_method=init_method, accel_backend=_recording())
    assert fake_init.only_call["init_method"] == init_method


def test_a_store_needs_no_master(fake_init: FakeInit, torchrun_env: pytest.MonkeyPatch) -> None:
    torchrun_env.delenv("MASTER_ADDR")
    torchrun_env.delenv("MASTER_PORT")
    store = dist.HashStore()
    accel.distributed.init_process_group(store=store, accel_backend=_recording())
    assert fake_init.only_call["store"] is store


# Which device is bound --------------------------------------------------------------------


@pytest.mark.parametrize(("local_rank", "count"), [(0, 4), (3, 4), (1, 2)])
def test_multi_device_binds_local_rank(
    fake_init: FakeInit, torchrun_env: pytest.MonkeyPatch, local_rank: int, count: int
) -> None:
    torchrun_env.setenv("LOCAL_RANK", str(local_rank))
    torchrun_env.setenv("LOCAL_WORLD_SIZE", str(count))
    torchrun_env.setenv("RANK", str(local_rank))
    torchrun_env.setenv("WORLD_SIZE", str(count))
    backend = _recording(MultiDeviceBackend(count))
    accel.distributed.init_process_group(accel_backend=backend)
    assert _set_device_calls(backend) == [(local_rank,)]


def test_local_rank_beyond_visible_devices(
    fake_init: FakeInit, torchrun_env: pytest.MonkeyPatch
) -> None:
    torchrun_env.setenv("RANK", "2")
    torchrun_env.setenv("LOCAL_RANK", "2")
    torchrun_env.setenv("WORLD_SIZE", "4")
    torchrun_env.delenv("LOCAL_WORLD_SIZE")
    backend = _recording(MultiDeviceBackend(2))
    with pytest.raises(DistributedSetupError) as caught:
        accel.distributed.init_process_group(accel_backend=backend)
    message = str(caught.value)
    assert message.startswith("accel.distributed: LOCAL_RANK=2 needs more devices")
    assert "2 visible device(s) (indices 0..1)" in message
    assert "--nproc_per_node" in message
    _assert_nothing_done(fake_init, backend)


def test_more_local_processes_than_devices_fails_on_every_rank(
    fake_init: FakeInit, torchrun_env: pytest.MonkeyPatch
) -> None:
    # Rank 0 of 4 local processes on 2 devices: its own index exists, but failing only on
    # ranks 2 and 3 would leave 0 and 1 waiting in the rendezvous until the timeout.
    torchrun_env.setenv("RANK", "0")
    torchrun_env.setenv("LOCAL_RANK", "0")
    torchrun_env.setenv("WORLD_SIZE", "4")
    torchrun_env.setenv("LOCAL_WORLD_SIZE", "4")
    backend = _recording(MultiDeviceBackend(2))
    with pytest.raises(DistributedSetupError, match=r"^accel\.distributed: LOCAL_WORLD_SIZE=4"):
        accel.distributed.init_process_group(accel_backend=backend)
    _assert_nothing_done(fake_init, backend)


def test_no_visible_device(fake_init: FakeInit, torchrun_env: pytest.MonkeyPatch) -> None:
    backend = _recording(MultiDeviceBackend(0))
    with pytest.raises(DistributedSetupError, match=r"sees no device .*device_count\(\) is 0"):
        accel.distributed.init_process_group(accel_backend=backend)
    _assert_nothing_done(fake_init, backend)


# Gaudi (the habana_frameworks double) ---------------------------------------------------


def test_hpu_prepares_hccl_and_passes_it(
    fake_init: FakeInit, torchrun_env: pytest.MonkeyPatch, habana_double: ModuleType
) -> None:
    # The bridge imports (and registers) hccl when the backend is created.
    backend = accel.get_backend("hpu")
    assert habana_double.call_names().count("hccl.import") == 1

    returned = accel.distributed.init_process_group(accel_backend=_recording(backend))

    assert returned.inner is backend  # type: ignore[attr-defined]
    returned.assert_order("prepare_distributed", "set_device")  # type: ignore[attr-defined]
    assert habana_double.call_names().count("hccl.import") == 1
    assert fake_init.only_call["backend"] == "hccl"


def test_hpu_is_picked_by_get_backend(
    fake_init: FakeInit, torchrun_env: pytest.MonkeyPatch, habana_double: ModuleType
) -> None:
    torchrun_env.setenv("ACCEL", "hpu")
    accel.distributed.init_process_group()
    assert "hccl.import" in habana_double.call_names()
    assert fake_init.only_call["backend"] == "hccl"


@pytest.mark.parametrize("local_rank", [0, 3, 7])
def test_hpu_binds_index_0_on_an_eight_card_node(
    fake_init: FakeInit,
    torchrun_env: pytest.MonkeyPatch,
    habana_double: ModuleType,
    local_rank: int,
) -> None:
    # The bridge sees all 8 cards but each process uses its own as index 0.
    habana_double.DEVICE_COUNT = 8
    torchrun_env.setenv("RANK", str(local_rank))
    torchrun_env.setenv("LOCAL_RANK", str(local_rank))
    torchrun_env.setenv("WORLD_SIZE", "8")
    torchrun_env.setenv("LOCAL_WORLD_SIZE", "8")
    backend = _recording(accel.get_backend("hpu"))
    accel.distributed.init_process_group(accel_backend=backend)
    assert _set_device_calls(backend) == [(0,)]
    assert fake_init.only_call["backend"] == "hccl"
    assert fake_init.only_call["rank"] == local_rank


def test_hpu_reports_one_device_whatever_the_card_count(
    fake_init: FakeInit, torchrun_env: pytest.MonkeyPatch, habana_double: ModuleType
) -> None:
    habana_double.DEVICE_COUNT = 8
    torchrun_env.setenv("WORLD_SIZE", "16")
    torchrun_env.setenv("LOCAL_WORLD_SIZE", "16")
    backend = _recording(accel.get_backend("hpu"))
    assert backend.device_count() == 1
    accel.distributed.init_process_group(accel_backend=backend)
    assert _set_device_calls(backend) == [(0,)]


@pytest.mark.parametrize("name", ["hpu", "cpu"])
def test_a_local_rank_other_than_the_one_at_creation_is_refused(
    fake_init: FakeInit,
    torchrun_env: pytest.MonkeyPatch,
    replace_spec: Callable[..., None],
    request: pytest.FixtureRequest,
    name: str,
) -> None:
    # hpu: the bridge chose card 1 from LOCAL_RANK=1; cpu: a plugin spec with the same flag.
    if name == "hpu":
        request.getfixturevalue("habana_double")
    else:
        replace_spec("cpu", binds_device_at_creation=True)
    backend = accel.get_backend(name)
    with pytest.raises(DistributedSetupError) as excinfo:
        accel.distributed.init_process_group(accel_backend=backend, local_rank=0)
    message = str(excinfo.value)
    assert message.startswith(f"accel.distributed: LOCAL_RANK was 1 when the {name} backend")
    assert f"The {name} backend binds its device from LOCAL_RANK when it is created" in message
    assert "Set LOCAL_RANK=0 in the environment before the first accel.get_backend()" in message
    assert fake_init.calls == []


def test_hpu_created_before_local_rank_was_set(
    fake_init: FakeInit, torchrun_env: pytest.MonkeyPatch, habana_double: ModuleType
) -> None:
    torchrun_env.delenv("LOCAL_RANK")
    backend = accel.get_backend("hpu")
    torchrun_env.setenv("LOCAL_RANK", "1")
    with pytest.raises(DistributedSetupError, match="LOCAL_RANK was unset when the hpu backend"):
        accel.distributed.init_process_group(accel_backend=backend)
    assert fake_init.calls == []


@pytest.mark.parametrize("selection", ["ACCEL", "auto"])
def test_hpu_refused_before_the_bridge_is_imported(
    fake_init: FakeInit,
    torchrun_env: pytest.MonkeyPatch,
    habana_double: ModuleType,
    selection: str,
) -> None:
    if selection == "ACCEL":
        torchrun_env.setenv("ACCEL", " HPU")
    torchrun_env.delenv("LOCAL_RANK")
    with pytest.raises(DistributedSetupError, match="LOCAL_RANK was unset when the hpu backend"):
        accel.distributed.init_process_group(local_rank=1)
    assert "habana_frameworks.torch" not in sys.modules
    assert fake_init.calls == []


def test_a_binding_backend_is_refused_before_it_is_created(
    fake_init: FakeInit, torchrun_env: pytest.MonkeyPatch, replace_spec: Callable[..., None]
) -> None:
    replace_spec("cpu", binds_device_at_creation=True)
    torchrun_env.setenv("ACCEL", "cpu")
    torchrun_env.delenv("LOCAL_RANK")
    with pytest.raises(DistributedSetupError, match="LOCAL_RANK was unset when the cpu backend"):
        accel.distributed.init_process_group(local_rank=1)
    assert _select.local_rank_at_creation("cpu") == (False, None)
    assert fake_init.calls == []


def test_backends_that_do_not_bind_at_creation_are_not_checked(
    fake_init: FakeInit, torchrun_env: pytest.MonkeyPatch
) -> None:
    backend = accel.get_backend("cpu")  # LOCAL_RANK=1, but cpu binds nothing when created
    accel.distributed.init_process_group(accel_backend=backend, local_rank=0)
    assert _select.local_rank_at_creation("cpu") == (False, None)
    assert fake_init.only_call["rank"] == 1


def test_only_hpu_among_the_built_ins_binds_at_creation() -> None:
    binding = {
        name
        for name in ("cpu", "cuda", "hpu", "xla", "xpu", "mps")
        if _select.binds_device_at_creation(name)
    }
    assert binding == {"hpu"}


def test_binds_device_at_creation_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="binds_device_at_creation must be a bool, got str"):
        accel.BackendSpec(
            "npu",
            CpuBackend,
            lambda: accel.Availability(True),
            binds_device_at_creation="yes",  # type: ignore[arg-type]
        )


def test_hpu_single_process_needs_no_local_rank(
    fake_init: FakeInit, torchrun_env: pytest.MonkeyPatch, habana_double: ModuleType
) -> None:
    for name in ("LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        torchrun_env.delenv(name)
    torchrun_env.setenv("RANK", "0")
    torchrun_env.setenv("WORLD_SIZE", "1")
    backend = accel.get_backend("hpu")
    accel.distributed.init_process_group(accel_backend=backend)
    assert fake_init.only_call["world_size"] == 1


# Errors -------------------------------------------------------------------------------


def _assert_nothing_done(fake_init: FakeInit, backend: RecordingBackend | None = None) -> None:
    assert fake_init.calls == []
    if backend is not None:
        backend.assert_not_called("prepare_distributed", "set_device")


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        pytest.param(
            {"WORLD_SIZE": None},
            ["RANK=1 is set but WORLD_SIZE is not", "torchrun"],
            id="rank-without-world-size",
        ),
        pytest.param(
            {"RANK": None},
            ["WORLD_SIZE=2 is set but RANK is not", "0..1"],
            id="world-size-without-rank",
        ),
        pytest.param(
            {"RANK": None, "WORLD_SIZE": None},
            ["RANK and WORLD_SIZE are not set", "pass rank= and world_size="],
            id="neither",
        ),
        pytest.param(
            {"RANK": "2"},
            ["RANK=2 is outside the job", "WORLD_SIZE=2", "from 0 to 1"],
            id="rank-equals-world-size",
        ),
        pytest.param({"RANK": "-1"}, ["RANK=-1 is outside the job"], id="negative-rank"),
        pytest.param(
            {"WORLD_SIZE": "0", "RANK": "0"},
            ["WORLD_SIZE=0 is not a valid world size"],
            id="zero-world-size",
        ),
        pytest.param(
            {"RANK": "one"}, ["RANK is 'one', which is not an integer"], id="rank-not-int"
        ),
        pytest.param(
            {"WORLD_SIZE": "2.0"},
            ["WORLD_SIZE is '2.0', which is not an integer"],
            id="world-size-not-int",
        ),
        pytest.param(
            {"LOCAL_RANK": ""},
            ["LOCAL_RANK is '', which is not an integer"],
            id="local-rank-empty",
        ),
        pytest.param(
            {"LOCAL_WORLD_SIZE": "x"},
            ["LOCAL_WORLD_SIZE is 'x', which is not an integer"],
            id="local-world-size-not-int",
        ),
        pytest.param(
            {"MASTER_PORT": "http"},
            ["MASTER_PORT is 'http', which is not an integer"],
            id="master-port-not-int",
        ),
        pytest.param(
            {"MASTER_PORT": "70000"},
            ["MASTER_PORT=70000 is not a TCP port"],
            id="master-port-out-of-range",
        ),
        pytest.param(
            {"LOCAL_RANK": None, "LOCAL_WORLD_SIZE": None},
            ["LOCAL_RANK is not set", "pass local_rank="],
            id="local-rank-missing",
        ),
        pytest.param(
            {"LOCAL_RANK": "2"},
            ["LOCAL_RANK=2 is not a valid local rank", "between 0 and 1"],
            id="local-rank-beyond-world",
        ),
        pytest.param(
            {"LOCAL_WORLD_SIZE": "1"},
            ["LOCAL_RANK=1 is not below LOCAL_WORLD_SIZE=1"],
            id="local-rank-beyond-local-world",
        ),
        pytest.param(
            {"LOCAL_WORLD_SIZE": "3"},
            ["LOCAL_WORLD_SIZE=3 is inconsistent with WORLD_SIZE=2"],
            id="local-world-size-beyond-world",
        ),
        pytest.param(
            {"MASTER_ADDR": None},
            ["MASTER_ADDR is not set", "env://", "init_method=None"],
            id="no-master-addr",
        ),
        pytest.param(
            {"MASTER_ADDR": None, "MASTER_PORT": None},
            ["MASTER_ADDR and MASTER_PORT are not set"],
            id="no-master",
        ),
    ],
)
def test_environment_errors(
    fake_init: FakeInit,
    torchrun_env: pytest.MonkeyPatch,
    changes: dict[str, str | None],
    expected: list[str],
) -> None:
    for name, value in changes.items():
        if value is None:
            torchrun_env.delenv(name)
        else:
            torchrun_env.setenv(name, value)
    backend = _recording()
    with pytest.raises(DistributedSetupError) as caught:
        accel.distributed.init_process_group(accel_backend=backend)
    message = str(caught.value)
    assert isinstance(caught.value, AccelError)
    assert message.startswith("accel.distributed: "), message
    for fragment in expected:
        assert fragment in message, (fragment, message)
    _assert_nothing_done(fake_init, backend)


def test_env_init_method_needs_master_port(
    fake_init: FakeInit, torchrun_env: pytest.MonkeyPatch
) -> None:
    torchrun_env.delenv("MASTER_PORT")
    with pytest.raises(DistributedSetupError, match=r"MASTER_PORT is not set.*'env://'"):
        accel.distributed.init_process_group(init_method="env://", accel_backend=_recording())
    _assert_nothing_done(fake_init)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"rank": "1"}, "rank='1' is not an integer"),
        ({"world_size": 2.0}, "world_size=2.0 is not an integer"),
        ({"local_rank": True}, "local_rank=True is not an integer"),
        ({"rank": 5, "world_size": 4}, "rank=5 is outside the job: with world_size=4"),
        ({"local_rank": -1}, "local_rank=-1 is not a valid local rank"),
    ],
)
def test_argument_errors(
    fake_init: FakeInit, torchrun_env: pytest.MonkeyPatch, kwargs: dict[str, Any], expected: str
) -> None:
    with pytest.raises(DistributedSetupError) as caught:
        accel.distributed.init_process_group(accel_backend=_recording(), **kwargs)
    assert str(caught.value).startswith("accel.distributed: " + expected), str(caught.value)
    _assert_nothing_done(fake_init)


@pytest.mark.parametrize(
    ("backend", "expected"),
    [
        ("bogus", "backend='bogus' names no torch.distributed backend this process knows (bogus)"),
        ("cpu:gloo,cuda:bogus", "backend='cpu:gloo,cuda:bogus' names no torch.distributed"),
        (7, "backend=7 is an int, not a str naming a torch.distributed backend"),
    ],
)
def test_unknown_communication_backend(
    fake_init: FakeInit, torchrun_env: pytest.MonkeyPatch, backend: object, expected: str
) -> None:
    recording = _recording()
    with pytest.raises(DistributedSetupError) as caught:
        accel.distributed.init_process_group(backend, accel_backend=recording)  # type: ignore[arg-type]
    message = str(caught.value)
    assert message.startswith("accel.distributed: " + expected), message
    assert "known here: " in message or "not a str" in message
    assert "Pass None to use recording's own 'gloo'" in message
    _assert_nothing_done(fake_init)
    recording.assert_not_called("prepare_distributed", "set_device")


def test_calling_twice(fake_init: FakeInit, torchrun_env: pytest.MonkeyPatch) -> None:
    accel.distributed.init_process_group(accel_backend=_recording())
    backend = _recording()
    with pytest.raises(DistributedSetupError) as caught:
        accel.distributed.init_process_group(accel_backend=backend)
    assert str(caught.value).startswith(
        "accel.distributed: the default process group is already initialised"
    )
    assert "destroy_process_group()" in str(caught.value)
    assert len(fake_init.calls) == 1
    backend.assert_not_called("prepare_distributed", "set_device")


def test_torch_without_distributed(fake_init: FakeInit, torchrun_env: pytest.MonkeyPatch) -> None:
    torchrun_env.setattr(dist, "is_available", lambda: False)
    with pytest.raises(DistributedSetupError, match=r"no torch\.distributed support"):
        accel.distributed.init_process_group(accel_backend=_recording())
    _assert_nothing_done(fake_init)


# Public surface and a real process group ------------------------------------------------


def test_not_reexported_from_accel() -> None:
    assert "init_process_group" not in accel.__all__
    assert not hasattr(accel, "init_process_group")
    assert issubclass(DistributedSetupError, AccelError)
    assert issubclass(DistributedSetupError, RuntimeError)


def test_rank_helpers_without_a_process_group() -> None:
    assert not dist.is_initialized()
    assert accel.distributed.get_rank() == 0
    assert accel.distributed.get_world_size() == 1


@pytest.fixture
def real_group_cleanup() -> Iterator[None]:
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_real_single_process_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real_group_cleanup: None
) -> None:
    for name in TORCHRUN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    backend = _recording()
    accel.distributed.init_process_group(
        init_method=f"file://{tmp_path / 'rendezvous'}",
        rank=0,
        world_size=1,
        accel_backend=backend,
        timeout=timedelta(seconds=20),
    )
    assert dist.is_initialized()
    assert dist.get_backend() == "gloo"
    assert (accel.distributed.get_rank(), accel.distributed.get_world_size()) == (0, 1)
    tensor = torch.ones(2)
    dist.all_reduce(tensor)
    assert tensor.tolist() == [1.0, 1.0]
    with pytest.raises(DistributedSetupError, match="already initialised"):
        accel.distributed.init_process_group(accel_backend=backend, rank=0, world_size=1)
    assert backend.count("set_device") == 1
    dist.destroy_process_group()
    assert not dist.is_initialized()


# Two processes under torchrun -------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _kill_workers(out: Path) -> None:
    """Kill every process started for ``out``: torchrun's workers leave its process group."""
    marker = f"ACCEL_TEST_OUT={out}".encode()
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue  # gone, not ours, or no /proc (then nothing is left to kill)


def _launch(script: str, out: Path) -> tuple[int | None, str]:
    """Run torchrun once; return its exit code (None on timeout) and its output."""
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {name: value for name, value in os.environ.items() if name not in TORCHRUN_VARIABLES}
    env.update(
        ACCEL="cpu",  # also on machines with accelerators: these tests are about gloo
        ACCEL_TEST_OUT=str(out),
        OMP_NUM_THREADS="1",
        PYTHONPATH=pythonpath,
    )
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={_free_port()}",
        str(SCRIPTS / script),
    ]
    # Output to a file, not a pipe: a worker that outlives torchrun would hold a pipe open
    # and block the read forever. A session of its own, so that on timeout the launcher is
    # killed with its group; workers that left the group are found by their environment.
    log_path = out / "torchrun.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            command,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            code: int | None = process.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            code = None
        finally:
            _kill_workers(out)
    return code, log_path.read_text()[-4000:]


def torchrun(script: str, out: Path) -> list[dict[str, Any]]:
    """Run ``script`` on 2 cpu processes with torchrun; return each rank's saved results.

    A run past ``TIMEOUT_S`` is tried once more (a gloo rendezvous on a loaded machine can
    stall); a second timeout or any failure fails the test with torchrun's output.
    """
    code, output = _launch(script, out)
    if code is None:
        code, output = _launch(script, out)
    if code is None:
        pytest.fail(f"torchrun {script} ran past {TIMEOUT_S} s twice:\n{output}")
    assert code == 0, f"torchrun {script} failed:\n{output}"
    results = []
    for rank in range(2):
        path = out / f"rank{rank}.pt"
        assert path.exists(), f"rank {rank} saved no results:\n{output[-4000:]}"
        results.append(torch.load(path, weights_only=True))
    return results


@pytest.fixture(scope="module")
def ddp_results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return torchrun("ddp_checkpoint.py", tmp_path_factory.mktemp("ddp"))


FSDP2_ON_CPU = torch_release() >= FSDP2_MIN_RELEASE_OFF_CUDA
FSDP2_CPU_REASON = (
    f"FSDP2 on the CPU needs torch {'.'.join(map(str, FSDP2_MIN_RELEASE_OFF_CUDA))} or newer "
    f"(this is {torch.__version__}, whose FSDP2 runs only on CUDA)"
)


@pytest.fixture(scope="module")
def fsdp_results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    if not FSDP2_ON_CPU:
        pytest.skip(FSDP2_CPU_REASON)
    return torchrun("fsdp_checkpoint.py", tmp_path_factory.mktemp("fsdp"))


@pytest.mark.skipif(
    FSDP2_ON_CPU,
    reason=f"torch {torch.__version__} runs FSDP2 on the CPU (it is "
    f"{'.'.join(map(str, FSDP2_MIN_RELEASE_OFF_CUDA))} or newer): nothing to refuse",
)
def test_fully_shard_refuses_the_cpu_where_torch_cannot(tmp_path: Path) -> None:
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        layer = torch.nn.Linear(2, 2)
        before = {name: p.clone() for name, p in layer.named_parameters()}
        with pytest.raises(DistributedSetupError, match=r"FSDP2 \(fully_shard\) on the CPU needs"):
            accel.distributed.fully_shard(layer)
        assert all(type(p) is torch.nn.Parameter for p in layer.parameters())  # not sharded
        for name, p in layer.named_parameters():
            assert torch.equal(p, before[name])
    finally:
        dist.destroy_process_group()


def test_fully_shard_is_torchs_fsdp2() -> None:
    for module_name in ("torch.distributed.fsdp", "torch.distributed._composable.fsdp"):
        module = __import__(module_name, fromlist=["fully_shard"])
        if hasattr(module, "fully_shard"):
            assert fsdp2_fully_shard() is module.fully_shard
            return
    pytest.fail("this torch has no FSDP2 fully_shard at either location")


@pytest.mark.slow
def test_torchrun_init_process_group(ddp_results: list[dict[str, Any]]) -> None:
    for rank, results in enumerate(ddp_results):
        setup = results["setup"]
        assert setup == {
            "env_rank": rank,
            "env_local_rank": rank,
            "rank": rank,
            "world_size": 2,
            "accel_rank": rank,
            "accel_world_size": 2,
            "communication": "gloo",
            "accel_backend": "cpu",
            "current_device": 0,
            "device": "cpu",
            "rank_sum": 1.0,  # 0 + 1: the all-reduce really went between the two ranks
        }
        assert results["initialized_after_destroy"] is False


# DDP averages the two half-batch gradients; the single process reduces over the whole
# batch at once. The sums are ordered differently, so the results agree up to float32
# rounding (observed: ~4e-9 on gradients of ~6e-2), not bit for bit. atol=1e-6 is far
# below any real difference: a rank that did not synchronise is off by ~1e-2.
GRAD_TOLERANCE = {"rtol": 0.0, "atol": 1e-6}


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["reentrant", "non_reentrant"])
def test_ddp_with_checkpoint_matches_one_process(
    ddp_results: list[dict[str, Any]], variant: str
) -> None:
    for results in ddp_results:
        case = results[variant]
        ddp, single = case["ddp"], case["single"]
        assert (
            len(ddp["grads"]) == len(single["grads"]) == 3 * 12
        )  # 3 steps x 6 layers x (weight, bias)
        for got, expected in zip(ddp["grads"], single["grads"], strict=True):
            torch.testing.assert_close(got, expected, **GRAD_TOLERANCE)
        for got, expected in zip(ddp["params"], single["params"], strict=True):
            torch.testing.assert_close(got, expected, **GRAD_TOLERANCE)
        assert case["recomputed"] == 3  # block1 recomputed once per step: checkpointed


# The job's loss is the mean of the two ranks' half-batch losses; FSDP2 reduce-scatters
# (averages) gradients in another order than one process's full-batch backward, so after
# the first step parameters differ by float32 rounding (observed: <3e-7) and the losses
# (about 3.7) by as much. 1e-5 absolute is well above rounding and far below the effect
# of a wrong gradient (the loss moves by ~1e-2 per step at lr=0.5).
LOSS_TOLERANCE = {"rtol": 0.0, "atol": 1e-5}
PARAM_TOLERANCE = {"rtol": 0.0, "atol": 1e-5}


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["reentrant", "non_reentrant"])
def test_fsdp2_with_checkpoint_matches_one_process(
    fsdp_results: list[dict[str, Any]], variant: str
) -> None:
    for results in fsdp_results:
        case = results[variant]
        assert case["wrapped"] == ["blocks.0", "blocks.1"]
        assert set(case["sharded"]) == {"DTensor"}
        assert case["recomputed"] == 2 * 4  # 2 blocks x 4 steps
        single_losses = results["single_losses"]
        assert len(case["losses"]) == len(single_losses) == 4
        torch.testing.assert_close(
            torch.tensor(case["losses"]), torch.tensor(single_losses), **LOSS_TOLERANCE
        )
        assert single_losses[0] != single_losses[-1]  # training moved the model
        assert case["params"].keys() == results["single"].keys()
        for name, expected in results["single"].items():
            torch.testing.assert_close(
                case["params"][name], expected, **PARAM_TOLERANCE, msg=lambda m, n=name: f"{n}: {m}"
            )


@pytest.fixture(scope="module")
def engine_results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return torchrun("engine_ddp.py", tmp_path_factory.mktemp("engine"))


@pytest.mark.slow
def test_engine_all_reduces_only_at_accumulation_boundaries(
    engine_results: list[dict[str, Any]],
) -> None:
    for results in engine_results:
        assert results["reduces"] == [0, 0, 1, 0, 0, 1]


@pytest.mark.slow
def test_engine_under_ddp_matches_one_process(engine_results: list[dict[str, Any]]) -> None:
    for results in engine_results:
        for distributed, alone in zip(results["distributed"], results["alone"], strict=True):
            torch.testing.assert_close(distributed, alone, **GRAD_TOLERANCE)
    first, second = engine_results
    for a, b in zip(first["distributed"], second["distributed"], strict=True):
        assert torch.equal(a, b)


def test_the_distributed_code_compares_no_backend_name() -> None:
    # Vendor traits come from BackendSpec and the protocol, never from a name check.
    import ast

    names = {"cuda", "hpu", "xla", "xpu", "mps"}
    found = []
    for module in ("distributed.py", "_launch.py"):
        tree = ast.parse((REPO / "accel" / module).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                found += [
                    f"{module}:{node.lineno}"
                    for operand in operands
                    if isinstance(operand, ast.Constant) and operand.value in names
                ]
    assert found == []
