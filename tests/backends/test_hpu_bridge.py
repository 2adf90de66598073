"""What importing Habana's bridge does to the process, as the double models it, and what
accel adds to it (nothing). These are the facts the README's hpu section states."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest
import torch

import accel
from backends.hpu import HpuBackend

habana_double_helpers = sys.modules["habana_double"]
DOUBLES_DIR = Path(__file__).resolve().parents[1] / "doubles"
REPO_ROOT = Path(__file__).resolve().parents[2]
LAUNCH_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "HLS_MODULE_ID",
    "ID",
    "HABANA_VISIBLE_MODULES",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "TORCHINDUCTOR_COMPILE_THREADS",
)


def _hpu() -> HpuBackend:
    backend = accel.get_backend("hpu")
    assert isinstance(backend, HpuBackend)
    return backend


@pytest.fixture
def clean_launch_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


# torch patches -----------------------------------------------------------------------------


def test_creating_the_backend_patches_torch_and_probing_does_not(
    habana_double: ModuleType,
) -> None:
    original = torch.manual_seed
    accel.list_backends()
    accel.select_backend()
    assert torch.manual_seed is original
    assert habana_double.patched() == []

    backend = _hpu()

    assert torch.manual_seed is not original
    assert set(habana_double.patched()) >= {
        "torch.manual_seed",
        "torch.seed",
        "torch.random.fork_rng",
        "Tensor.record_stream",
        "torch.save",
        "torch.load",
        "Module.__setattr__",
        "Module.add_module",
        "torch.distributed.init_process_group",
        "torch.distributed.new_group",
    }
    # The patched torch.manual_seed seeds the hpu generator too.
    backend.manual_seed(1)
    seeded_by_backend = backend.get_rng_state()
    backend.manual_seed(2)
    torch.manual_seed(1)
    assert torch.equal(backend.get_rng_state(), seeded_by_backend)
    assert "patched.manual_seed" in habana_double.call_names()


def test_the_double_undoes_its_patches(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    saved = (torch.manual_seed, torch.random.fork_rng, torch.nn.Module.__setattr__)
    activation = habana_double_helpers.activate(monkeypatch, tmp_path / "dev")
    accel.get_backend("hpu")
    assert torch.manual_seed is not saved[0]
    assert torch.hpu.is_initialized() is False  # type: ignore[attr-defined]
    habana_double_helpers.deactivate(activation)
    assert (torch.manual_seed, torch.random.fork_rng, torch.nn.Module.__setattr__) == saved
    assert not hasattr(torch, "hpu")
    assert (
        "__setattr__" not in vars(torch.nn.Module)
        or saved[2] is vars(torch.nn.Module)["__setattr__"]
    )


# Environment writes --------------------------------------------------------------------------


def test_environment_writes_happen_when_the_backend_is_created(
    habana_double: ModuleType, clean_launch_env: pytest.MonkeyPatch
) -> None:
    for name, value in {"RANK": "11", "LOCAL_RANK": "3", "WORLD_SIZE": "16"}.items():
        clean_launch_env.setenv(name, value)
    backend = _hpu()
    # With the torchrun variables all set the bridge leaves MASTER_ADDR/PORT alone.
    assert dict(habana_double.ENV_WRITES) == {
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
        "HLS_MODULE_ID": "3",
        "ID": "11",
    }
    assert os.environ["HLS_MODULE_ID"] == "3"
    assert backend.local_rank_at_creation == 3

    writes = len(habana_double.ENV_WRITES)
    backend.prepare_distributed()
    backend.mark_step()
    assert len(habana_double.ENV_WRITES) == writes


def test_module_id_follows_habana_visible_modules(
    habana_double: ModuleType, clean_launch_env: pytest.MonkeyPatch
) -> None:
    for name, value in {
        "RANK": "1",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "HABANA_VISIBLE_MODULES": "4,5,6,7",
    }.items():
        clean_launch_env.setenv(name, value)
    _hpu()
    assert os.environ["HLS_MODULE_ID"] == "5"


def test_single_process_and_unset_local_rank_choose_no_module(
    habana_double: ModuleType, clean_launch_env: pytest.MonkeyPatch
) -> None:
    clean_launch_env.setenv("WORLD_SIZE", "2")
    backend = _hpu()
    assert "HLS_MODULE_ID" not in os.environ
    assert backend.local_rank_at_creation is None


def test_open_mpi_variables_become_torchrun_variables(
    habana_double: ModuleType, clean_launch_env: pytest.MonkeyPatch
) -> None:
    for name, value in {
        "OMPI_COMM_WORLD_LOCAL_RANK": "2",
        "OMPI_COMM_WORLD_SIZE": "8",
        "OMPI_COMM_WORLD_RANK": "6",
    }.items():
        clean_launch_env.setenv(name, value)
    _hpu()
    assert (os.environ["LOCAL_RANK"], os.environ["WORLD_SIZE"], os.environ["RANK"]) == (
        "2",
        "8",
        "6",
    )
    assert os.environ["HLS_MODULE_ID"] == "2"


class _WriteRecordingEnviron(dict[str, str]):
    """Stands in for os.environ and records every write, even one that changes nothing."""

    def __init__(self, initial: dict[str, str]) -> None:
        super().__init__(initial)
        self.writes: list[str] = []

    def __setitem__(self, key: str, value: str) -> None:
        self.writes.append(key)
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
def test_accel_adds_no_process_setting_to_the_bridges(
    habana_double: ModuleType,
    clean_launch_env: pytest.MonkeyPatch,
    deterministic: bool,
) -> None:
    previous = torch.are_deterministic_algorithms_enabled()
    # Before os.environ is replaced: its first call imports torch._inductor, which writes
    # TORCHINDUCTOR_CACHE_DIR.
    torch.use_deterministic_algorithms(deterministic)
    try:
        environ = _WriteRecordingEnviron(dict(os.environ))
        clean_launch_env.setattr(os, "environ", environ)
        putenv_calls: list[tuple[str, ...]] = []
        clean_launch_env.setattr(os, "putenv", lambda *args: putenv_calls.append(args))
        clean_launch_env.setattr(os, "unsetenv", lambda *args: putenv_calls.append(args))
        dtype_before = torch.get_default_dtype()

        backend = _hpu()
        backend.mark_step()
        backend.prepare_distributed()

        # Every write is one the bridge made on import; accel made none.
        assert environ.writes == [name for name, _ in habana_double.ENV_WRITES]
        assert environ.writes == ["TORCHINDUCTOR_COMPILE_THREADS", "MASTER_ADDR", "MASTER_PORT"]
        assert putenv_calls == []
        assert torch.are_deterministic_algorithms_enabled() is deterministic
        assert torch.get_default_dtype() == dtype_before
    finally:
        torch.use_deterministic_algorithms(previous)


# Autoload ----------------------------------------------------------------------------------

_AUTOLOAD_SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    print("habana_frameworks.torch" in sys.modules)
    """
)


@pytest.mark.slow
@pytest.mark.skipif(
    not hasattr(torch, "_import_device_backends"),
    reason="torch.backends entry points are loaded at import since torch 2.5 only",
)
@pytest.mark.parametrize(
    ("variables", "imported"),
    [({}, True), ({"PT_HPU_AUTOLOAD": "0"}, False), ({"PT_HPU_LAZY_MODE": "1"}, False)],
    ids=["default", "PT_HPU_AUTOLOAD=0", "PT_HPU_LAZY_MODE=1"],
)
def test_import_torch_alone_imports_the_bridge_through_autoload(
    variables: dict[str, str], imported: bool
) -> None:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("ACCEL", "PT_HPU", "TORCH_DEVICE_BACKEND"))
    }
    env.update(variables)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(DOUBLES_DIR), str(habana_double_helpers.AUTOLOAD_SITE), str(REPO_ROOT)]
    )
    completed = subprocess.run(
        [sys.executable, "-c", _AUTOLOAD_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip().splitlines()[-1] == str(imported)


# Lazy mode, streams, device acquisition, RNG -----------------------------------------------------


@pytest.mark.parametrize(("release_default", "lazy"), [("1", True), ("0", False)])
def test_lazy_mode_default_is_the_releases_and_cached_on_first_read(
    habana_double: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    release_default: str,
    lazy: bool,
) -> None:
    habana_double.RELEASE_LAZY_DEFAULT = release_default
    backend = _hpu()
    assert backend.is_lazy is lazy
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0" if lazy else "1")
    internal = importlib.import_module("habana_frameworks.torch.utils.internal")
    assert internal.is_lazy() is lazy


def test_queries_do_not_acquire_the_card_and_memory_or_streams_do(
    habana_double: ModuleType,
) -> None:
    backend = _hpu()
    backend.is_available()
    backend.device_count()
    backend.device()
    backend.current_device()
    backend.manual_seed(0)
    backend.set_rng_state(backend.get_rng_state())
    with backend.fork_rng():
        pass
    backend.mark_step()
    backend.autocast_kwargs()
    assert habana_double.call_args("device.acquire") == []

    backend.memory_allocated()
    backend.current_stream()
    assert habana_double.call_args("device.acquire") == [("hpu.memory_allocated",)]


def test_stream_creation_acquires_the_card(habana_double: ModuleType) -> None:
    _hpu().Stream()
    assert habana_double.call_args("device.acquire") == [("hpu.Stream",)]


def test_init_sets_checkpoints_default_device_type(habana_double: ModuleType) -> None:
    hpu = importlib.import_module("habana_frameworks.torch.hpu")
    before = torch.utils.checkpoint.DefaultDeviceType.get_device_type()
    hpu.init()
    assert torch.utils.checkpoint.DefaultDeviceType.get_device_type() == "hpu"
    habana_double.undo_process_changes()
    assert torch.utils.checkpoint.DefaultDeviceType.get_device_type() == before


def test_bridge_manual_seed_returns_a_generator_and_backend_returns_none(
    habana_double: ModuleType,
) -> None:
    backend = _hpu()
    random = importlib.import_module("habana_frameworks.torch.hpu.random")
    assert isinstance(random.manual_seed(3), torch.Generator)
    assert backend.manual_seed(3) is None  # type: ignore[func-returns-value]


@pytest.mark.parametrize("device", ["cuda:0", "hpu-0", "bogus", 1.5])
def test_bad_device_strings_raise_value_error(habana_double: ModuleType, device: object) -> None:
    _hpu()
    random = importlib.import_module("habana_frameworks.torch.hpu.random")
    hpu = importlib.import_module("habana_frameworks.torch.hpu")
    with pytest.raises(ValueError, match="Expected a hpu device"):
        random.get_rng_state(device)
    with pytest.raises(ValueError, match="Expected a hpu device"):
        hpu.memory_allocated(device)


def test_philox_state_is_shared_by_the_bridge_and_copied_by_the_backend(
    habana_double: ModuleType,
) -> None:
    # Issue 10, item 5: fork_rng saved the live tensor, so it restored nothing.
    random = importlib.import_module("habana_frameworks.torch.hpu.random")
    backend = _hpu()
    random.set_rng_ctx("philox")
    assert random.get_rng_state(0) is random.get_rng_state(0)

    saved = backend.get_rng_state()
    snapshot = saved.clone()
    assert saved.data_ptr() != random.get_rng_state(0).data_ptr()
    other = snapshot.clone()
    other[8] = 4  # another offset
    with backend.fork_rng():
        backend.set_rng_state(other)
        assert torch.equal(random.get_rng_state(0), other)

    assert torch.equal(saved, snapshot)
    assert torch.equal(backend.get_rng_state(), snapshot)
    assert torch.equal(random.get_rng_state(0), snapshot)
