"""The generic PrivateUse1 backend against a fake device module (no device needed).

Selection, listing, the messages for an absent device (torch 2.4 included), plugin
precedence and the capabilities found out. The same backend on a real PrivateUse1
device (PyTorch's reference, openreg) is tested in ``test_privateuse1_device.py``.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import accel
from accel import _compat
from accel._cli import main
from backends import privateuse1
from backends.privateuse1 import PrivateUse1Backend

DATA = Path(__file__).resolve().parents[1] / "data"
NAME = "fakenpu"


class FakeModule(SimpleNamespace):
    """A vendor's device module: only what the PrivateUse1 contract requires."""

    def __init__(self, count: int = 2) -> None:
        self.count = count
        self.initialized = False
        self.seeded: list[tuple[str, int]] = []
        self.states = {index: torch.full((4,), index, dtype=torch.uint8) for index in range(2)}

    def is_available(self) -> bool:
        return self.count > 0

    def device_count(self) -> int:
        return self.count

    def is_initialized(self) -> bool:
        return self.initialized

    def current_device(self) -> int:
        self.initialized = True
        return 0

    def manual_seed_all(self, seed: int) -> None:
        self.seeded.append(("all", seed))

    def get_rng_state(self, index: int = 0) -> torch.Tensor:
        return self.states[index].clone()

    def set_rng_state(self, state: torch.Tensor, index: int = 0) -> None:
        self.states[index] = state.clone()

    def get_amp_supported_dtype(self) -> list[torch.dtype]:
        return [torch.float16]

    def _is_in_bad_fork(self) -> bool:
        return False


@pytest.fixture
def fake_device(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeModule]:
    """Make torch look as if a vendor had registered ``fakenpu`` through PrivateUse1."""
    module = FakeModule()
    monkeypatch.setattr(_compat, "privateuse1_device_type", lambda: NAME)
    monkeypatch.setattr(torch, NAME, module, raising=False)
    accel.reset_backends()
    yield module
    accel.reset_backends()


@pytest.fixture
def no_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make torch look as if no vendor had registered a PrivateUse1 device.

    The torch is one that autoloads device packages (2.5 and later); the torch 2.4 test
    switches that off itself.
    """
    monkeypatch.setattr(_compat, "privateuse1_device_type", lambda: None)
    monkeypatch.setattr(_compat, "DEVICE_BACKENDS_AUTOLOAD", True)
    accel.reset_backends()


def _row(name: str) -> accel.BackendInfo:
    rows = [row for row in accel.list_backends() if row.name == name]
    assert len(rows) == 1, rows
    return rows[0]


def _site(monkeypatch: pytest.MonkeyPatch, site: str) -> Iterator[None]:
    monkeypatch.syspath_prepend(str(DATA / site))
    accel.reset_backends()
    yield
    for name in [n for n in sys.modules if n.startswith("accel_fake_pu1")]:
        del sys.modules[name]


# The device is absent ------------------------------------------------------------------


def test_without_a_device_it_is_listed_with_the_reason(no_device: None) -> None:
    row = _row(privateuse1.UNREGISTERED_NAME)
    assert not row.available and row.priority < 0
    assert row.reason is not None and "PrivateUse1" in row.reason
    assert "'torch.backends' entry point" in row.reason
    assert accel.select_backend().name == "cpu"


def test_without_a_device_naming_one_says_how_it_would_appear(no_device: None) -> None:
    with pytest.raises(accel.BackendNotFoundError) as info:
        accel.get_backend(NAME)
    message = str(info.value)
    assert f"If {NAME!r} is a device that joins torch through PrivateUse1" in message
    assert "install the vendor's torch package" in message


def test_autoload_switched_off_is_named(no_device: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    reason = _row(privateuse1.UNREGISTERED_NAME).reason
    assert reason is not None and "TORCH_DEVICE_BACKEND_AUTOLOAD is '0'" in reason


def test_on_torch_2_4_the_vendor_package_must_be_imported_first(
    no_device: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_compat, "DEVICE_BACKENDS_AUTOLOAD", False)
    reason = _row(privateuse1.UNREGISTERED_NAME).reason
    assert reason is not None
    assert "does not load device extensions by itself (autoloading arrived in torch 2.5)" in reason
    assert "import the vendor's torch package before accel looks for backends" in reason
    with pytest.raises(accel.BackendUnavailableError, match="import the vendor's torch package"):
        accel.get_backend(privateuse1.UNREGISTERED_NAME)


def test_a_renamed_device_without_a_module_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_compat, "privateuse1_device_type", lambda: NAME)
    monkeypatch.delattr(torch, NAME, raising=False)
    accel.reset_backends()
    reason = _row(NAME).reason
    assert reason is not None and f"no device module torch.{NAME} is registered" in reason


def test_a_device_module_that_counts_none_is_unavailable(fake_device: FakeModule) -> None:
    fake_device.count = 0
    row = _row(NAME)
    assert not row.available and row.reason is not None
    assert f"no {NAME} device is visible" in row.reason


def test_the_name_comes_from_torch() -> None:
    # The real lookup: torch.device("privateuseone") names the renamed device type.
    expected = torch.device("privateuseone").type
    assert _compat.privateuse1_device_type() == (
        None if expected == _compat.PRIVATEUSE1_DEFAULT_NAME else expected
    )


# The device is registered ---------------------------------------------------------------


def test_auto_detection_picks_it_without_initialising(fake_device: FakeModule) -> None:
    row = _row(NAME)
    assert row.available and row.device_count == 2 and row.priority == privateuse1.PRIORITY
    assert accel.select_backend() == accel.Selection(NAME, "auto")
    backend = accel.get_backend()
    assert isinstance(backend, PrivateUse1Backend) and backend.name == NAME
    # (torch.device("fakenpu") cannot be built: torch only knows renamed device types.)
    assert backend.is_available() and backend.device_count() == 2
    assert not fake_device.initialized


def test_it_is_selected_by_name_and_by_accel(
    fake_device: FakeModule, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert accel.get_backend(NAME).name == NAME
    monkeypatch.setenv("ACCEL", NAME)
    assert accel.select_backend().reason == "ACCEL" and accel.get_backend().name == NAME
    monkeypatch.setenv("ACCEL", "cpu")
    assert accel.get_backend().name == "cpu"


def test_the_listing_shows_it(fake_device: FakeModule, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    assert f"get_backend() would pick: {NAME} (auto-detected" in out
    line = next(line for line in out.splitlines() if line.startswith(NAME))
    assert line.split()[:6] == [NAME, "built-in", accel.__version__, "available", "2", "225"]


def test_indices_and_rng(fake_device: FakeModule) -> None:
    backend = PrivateUse1Backend(NAME)
    with pytest.raises(accel.DeviceIndexError, match="this process sees 2 device"):
        backend.device(2)
    assert torch.equal(backend.get_rng_state(1), torch.full((4,), 1, dtype=torch.uint8))
    with backend.fork_rng(devices=[1]):
        backend.set_rng_state(torch.zeros(4, dtype=torch.uint8), 1)
    assert torch.equal(fake_device.states[1], torch.full((4,), 1, dtype=torch.uint8))


def test_no_communication_backend_is_a_sentence(fake_device: FakeModule) -> None:
    backend = PrivateUse1Backend(NAME)
    assert backend.communication_backend == "undefined"
    with pytest.raises(accel.DistributedSetupError) as info:
        backend.prepare_distributed()
    message = str(info.value)
    assert message.startswith(f"{NAME}: torch.distributed has no communication backend")
    assert f"devices=[{NAME!r}]" in message and message.endswith(".")


def test_the_communication_backend_comes_from_torchs_map(
    fake_device: FakeModule, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch.distributed as dist

    mapping = {**dist.Backend.default_device_backend_map, NAME: "fakeccl"}
    monkeypatch.setattr(dist.Backend, "default_device_backend_map", mapping)
    backend = PrivateUse1Backend(NAME)
    assert backend.communication_backend == "fakeccl"
    backend.prepare_distributed()


def test_memory_statistics_only_where_the_device_answers(
    fake_device: FakeModule, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuses() -> int:
        raise RuntimeError(f"Allocator for {NAME} is not a DeviceAllocator")

    # The module has no memory functions, and torch.accelerator's assert.
    monkeypatch.setattr(_compat, "accelerator_function", lambda name: refuses)
    backend = PrivateUse1Backend(NAME)
    assert backend.supports_memory_stats is False
    assert backend.memory_allocated() == 0 and backend.max_memory_allocated() == 0
    backend.reset_peak_memory_stats()
    backend.empty_cache()

    calls: list[str] = []
    fake_device.memory_allocated = lambda: 7
    fake_device.max_memory_allocated = lambda: 9
    fake_device.reset_peak_memory_stats = lambda: calls.append("reset")
    fake_device.empty_cache = lambda: calls.append("empty")
    answering = PrivateUse1Backend(NAME)
    assert answering.supports_memory_stats is True
    assert answering.memory_allocated() == 7 and answering.max_memory_allocated() == 9
    answering.reset_peak_memory_stats()
    answering.empty_cache()
    assert calls == ["reset", "empty"]


def test_manual_seed_without_a_per_device_seed_seeds_every_device(
    fake_device: FakeModule, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = PrivateUse1Backend(NAME)
    monkeypatch.setattr(backend, "random_ops_draw_from_cpu", lambda: False)
    backend.manual_seed(3)
    assert fake_device.seeded == [("all", 3)]


def test_where_random_ops_draw_from_the_cpu_generator_both_are_seeded(
    fake_device: FakeModule, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = PrivateUse1Backend(NAME)
    monkeypatch.setattr(backend, "random_ops_draw_from_cpu", lambda: True)
    backend.manual_seed(5)
    first = torch.rand(3)
    backend.manual_seed(5)
    assert torch.equal(torch.rand(3), first)
    assert fake_device.seeded == [("all", 5), ("all", 5)]


def test_without_torchs_stream_api_streams_are_null(
    fake_device: FakeModule, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch 2.4 and 2.5 have no torch.accelerator, and this module no Stream.
    monkeypatch.setattr(_compat, "accelerator_function", lambda name: None)
    backend = PrivateUse1Backend(NAME)
    assert backend.supports_streams is False
    stream = backend.Stream()
    assert stream.query() and backend.current_stream().query()
    with backend.stream(stream):
        pass
    backend.record_stream(torch.ones(1), stream)


def test_dtype_support_is_found_out(fake_device: FakeModule) -> None:
    fake_device.is_bf16_supported = lambda: False
    backend = PrivateUse1Backend(NAME)
    assert backend.is_bf16_supported() is False
    assert isinstance(backend.is_fp16_supported(), bool)


def test_the_backend_refuses_a_missing_device(no_device: None) -> None:
    with pytest.raises(RuntimeError, match="no device has joined torch through PrivateUse1"):
        PrivateUse1Backend()


# An accel plugin for the same device wins -----------------------------------------------


@pytest.fixture
def same_name_plugin(fake_device: FakeModule, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from _site(monkeypatch, "pu1_name_site")


@pytest.fixture
def device_type_plugin(fake_device: FakeModule, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from _site(monkeypatch, "pu1_type_site")


def test_a_plugin_with_the_devices_name_replaces_the_generic_backend(
    same_name_plugin: None,
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no reserved-name refusal
        row = _row(NAME)
    assert row.provider == "accel-fake-pu1-name"
    backend = accel.get_backend(NAME)
    assert type(backend).__name__ == "VendorBackend"
    assert accel.select_backend().name == NAME


def test_a_plugin_declaring_the_device_type_wins_auto_detection(
    device_type_plugin: None,
) -> None:
    generic = _row(NAME)
    assert generic.available and not generic.automatic
    assert generic.reason is not None and "'fakevendor'" in generic.reason
    assert accel.select_backend() == accel.Selection("fakevendor", "auto")
    # Named, the generic backend is still there.
    assert isinstance(accel.get_backend(NAME), PrivateUse1Backend)


def test_a_spec_device_type_must_be_a_str() -> None:
    with pytest.raises(TypeError, match="device_type must be a str"):
        accel.BackendSpec(
            "npu",
            lambda: accel.get_backend("cpu"),
            lambda: accel.Availability(True),
            device_type=3,  # type: ignore[arg-type]
        )
