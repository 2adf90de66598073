"""The CUDA/XPU backend class, against a fake torch device module (no GPU needed)."""

from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import accel
from backends import cuda, xpu
from backends._torch_device import TorchDeviceBackend


class FakeDeviceModule(SimpleNamespace):
    """Stands in for torch.cuda / torch.xpu and records what is called."""

    def __init__(self, count: int = 2) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.initialized = False
        self.count = count
        self.state = torch.arange(8, dtype=torch.uint8)

    def _record(self, name: str, *args: Any) -> None:
        self.calls.append((name, args))

    def is_initialized(self) -> bool:
        return self.initialized

    def device_count(self) -> int:
        return self.count

    def current_device(self) -> int:
        self.initialized = True
        return 1

    def set_device(self, index: int) -> None:
        self._record("set_device", index)

    def synchronize(self) -> None:
        self._record("synchronize")

    def manual_seed(self, seed: int) -> None:
        self._record("manual_seed", seed)

    def get_rng_state(self) -> torch.Tensor:
        return self.state.clone()

    def set_rng_state(self, state: torch.Tensor) -> None:
        self.state = state.clone()

    def current_stream(self) -> str:
        return "current"

    def stream(self, stream: Any) -> Any:
        self._record("stream", stream)
        return nullcontext(stream)

    def memory_allocated(self) -> int:
        return 10

    def max_memory_allocated(self) -> int:
        return 20

    def reset_peak_memory_stats(self) -> None:
        self._record("reset_peak_memory_stats")

    def empty_cache(self) -> None:
        self._record("empty_cache")

    def is_bf16_supported(self) -> bool:
        return False

    Stream = object
    Event = object


class FakeBackend(TorchDeviceBackend):
    name = "fake"
    device_type = "cuda"
    communication_backend = "nccl"


@pytest.fixture
def module() -> FakeDeviceModule:
    return FakeDeviceModule()


@pytest.fixture
def backend(module: FakeDeviceModule) -> FakeBackend:
    return FakeBackend(module)  # type: ignore[arg-type]


def test_device_does_not_initialise(backend: FakeBackend, module: FakeDeviceModule) -> None:
    assert backend.device() == torch.device("cuda", 0)
    assert not module.initialized
    assert backend.device(1) == torch.device("cuda", 1)
    assert backend.is_available() and backend.device_count() == 2
    assert not module.initialized


def test_device_follows_current_once_initialised(
    backend: FakeBackend, module: FakeDeviceModule
) -> None:
    module.initialized = True
    assert backend.device() == torch.device("cuda", 1)


def test_indices_are_checked(backend: FakeBackend, module: FakeDeviceModule) -> None:
    with pytest.raises(accel.DeviceIndexError, match="this process sees 2 device"):
        backend.set_device(2)
    backend.set_device(1)
    assert module.calls == [("set_device", (1,))]


def test_rng_and_fork(backend: FakeBackend, module: FakeDeviceModule) -> None:
    before = backend.get_rng_state()
    cpu_before = torch.get_rng_state()
    with backend.fork_rng():
        backend.set_rng_state(torch.zeros(8, dtype=torch.uint8))
        torch.manual_seed(1)
    assert torch.equal(module.state, before)
    assert torch.equal(torch.get_rng_state(), cpu_before)


def test_delegation(backend: FakeBackend, module: FakeDeviceModule) -> None:
    backend.synchronize()
    backend.manual_seed(5)
    backend.reset_peak_memory_stats()
    backend.empty_cache()
    with backend.stream("side"):
        pass
    assert [name for name, _ in module.calls] == [
        "synchronize",
        "manual_seed",
        "reset_peak_memory_stats",
        "empty_cache",
        "stream",
    ]
    assert (backend.memory_allocated(), backend.max_memory_allocated()) == (10, 20)
    assert backend.current_stream() == "current"
    assert backend.Stream is object and backend.Event is object
    assert backend.is_bf16_supported() is False
    assert backend.autocast_kwargs()["device_type"] == "cuda"


def test_flags() -> None:
    assert TorchDeviceBackend.is_asynchronous and TorchDeviceBackend.supports_streams
    assert TorchDeviceBackend.supports_pinned_memory and TorchDeviceBackend.supports_memory_stats
    assert (cuda.CudaBackend.communication_backend, xpu.XpuBackend.communication_backend) == (
        "nccl",
        "xccl",
    )


def test_cuda_probe_counts_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    availability = cuda._probe()
    assert not availability.available
    assert "no CUDA device is visible (torch.cuda.device_count() is 0)" in str(availability.reason)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert cuda._probe() == accel.Availability(available=True, device_count=4)


def test_cuda_probe_on_a_cpu_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None)
    reason = str(cuda._probe().reason)
    assert reason.startswith("no CUDA device is visible: this torch build")


def test_xpu_probe_on_this_build() -> None:
    if torch.xpu._is_compiled():
        pytest.skip("this torch build has XPU support; the message checked is for builds without")
    assert "has no XPU support" in str(xpu._probe().reason)


@pytest.mark.accel("cuda")
def test_real_cuda_device_matches_tensor_placement(accel_backend: accel.Accelerator) -> None:
    tensor = torch.ones(1, device=accel_backend.device())
    assert tensor.device == accel_backend.device()
    assert accel_backend.memory_allocated() > 0


def test_record_stream_delegates_to_the_tensor(backend: FakeBackend) -> None:
    class Tensor:
        def __init__(self) -> None:
            self.streams: list[object] = []

        def record_stream(self, stream: object) -> None:
            self.streams.append(stream)

    tensor = Tensor()
    backend.record_stream(tensor, "side")  # type: ignore[arg-type]
    assert tensor.streams == ["side"]


def test_null_record_stream_does_nothing() -> None:
    cpu = accel.get_backend("cpu")
    tensor = torch.ones(2)
    cpu.record_stream(tensor, cpu.current_stream())
    assert torch.equal(tensor, torch.ones(2))
