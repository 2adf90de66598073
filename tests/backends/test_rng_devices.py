"""Per-device generators (``index``, ``fork_rng(devices=...)``) and ``compile_backend``."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

import accel
from backends._torch_device import TorchDeviceBackend
from backends.cpu import CpuBackend
from backends.cuda import CudaBackend
from backends.hpu import HpuBackend
from backends.mps import MpsBackend
from backends.xpu import XpuBackend


class _Generators(SimpleNamespace):
    """A device module with one generator state per device."""

    def __init__(self) -> None:
        self.states = {0: torch.zeros(4, dtype=torch.uint8), 1: torch.ones(4, dtype=torch.uint8)}
        self.current = 0

    def device_count(self) -> int:
        return 2

    def get_rng_state(self, device: Any = "cuda") -> torch.Tensor:
        index = self.current if device == "cuda" else device
        return self.states[index].clone()

    def set_rng_state(self, state: torch.Tensor, device: Any = "cuda") -> None:
        self.states[self.current if device == "cuda" else device] = state.clone()


class _TwoGpus(TorchDeviceBackend):
    name = "two"
    device_type = "cuda"
    communication_backend = "nccl"


def test_index_addresses_each_device_generator() -> None:
    module = _Generators()
    backend = _TwoGpus(module)  # type: ignore[arg-type]
    assert torch.equal(backend.get_rng_state(1), torch.ones(4, dtype=torch.uint8))
    assert torch.equal(backend.get_rng_state(), torch.zeros(4, dtype=torch.uint8))
    backend.set_rng_state(torch.full((4,), 7, dtype=torch.uint8), 1)
    assert module.states[1].tolist() == [7] * 4 and module.states[0].tolist() == [0] * 4
    with pytest.raises(accel.DeviceIndexError):
        backend.get_rng_state(2)


def test_fork_rng_restores_the_listed_devices_only() -> None:
    module = _Generators()
    backend = _TwoGpus(module)  # type: ignore[arg-type]
    with backend.fork_rng(devices=[1]):
        backend.set_rng_state(torch.full((4,), 9, dtype=torch.uint8), 1)
        backend.set_rng_state(torch.full((4,), 9, dtype=torch.uint8), 0)
    assert module.states[1].tolist() == [1] * 4  # restored
    assert module.states[0].tolist() == [9] * 4  # not listed: left as set


def test_single_device_backends_accept_index_zero_only() -> None:
    backend = CpuBackend()
    state = backend.get_rng_state(0)
    backend.set_rng_state(state, 0)
    with backend.fork_rng(devices=[0]):
        torch.manual_seed(3)
    assert torch.equal(torch.get_rng_state(), state)
    with pytest.raises(accel.DeviceIndexError):
        backend.get_rng_state(1)
    with pytest.raises(accel.DeviceIndexError):
        backend.fork_rng(devices=[1])


@pytest.mark.parametrize(
    ("cls", "expected"),
    [
        (CpuBackend, "inductor"),
        (CudaBackend, "inductor"),
        (XpuBackend, "inductor"),
        (MpsBackend, "aot_eager"),
        (HpuBackend, "hpu_backend"),
    ],
)
def test_compile_backend(cls: type, expected: str) -> None:
    # Read on the class: creating the object would import the vendor library.
    assert cls.compile_backend == expected
