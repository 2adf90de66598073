"""Identity, device indices, capability flags and the no-initialisation rule."""

from __future__ import annotations

import pytest
import torch

import accel
from accel import Accelerator, DeviceIndexError
from accel._protocol import iter_missing_members
from accel.conformance import rule

CAPABILITY_FLAGS = (
    "is_lazy",
    "is_asynchronous",
    "supports_streams",
    "supports_pinned_memory",
    "supports_memory_stats",
)


def test_members(accel_backend: Accelerator) -> None:
    missing = list(iter_missing_members(accel_backend))
    assert not missing, rule("members", f"missing {missing}")
    assert isinstance(accel_backend, Accelerator), rule("members", "isinstance check failed")


def test_identity(accel_backend: Accelerator) -> None:
    device = accel_backend.device()
    assert isinstance(device, torch.device), rule("identity", f"device() returned {device!r}")
    assert device.type == accel_backend.device_type, rule(
        "identity", f"device().type {device.type!r} != device_type {accel_backend.device_type!r}"
    )
    assert torch.device(str(device)) == device, rule("identity", f"{device!r} does not round-trip")
    assert accel_backend.name == accel_backend.name.strip().lower(), rule(
        "identity", f"name {accel_backend.name!r} is not lowercase"
    )
    assert accel.get_backend(accel_backend.name) is accel_backend, rule(
        "identity", "get_backend(name) did not return the same instance"
    )


def test_device_count_and_current(accel_backend: Accelerator) -> None:
    count = accel_backend.device_count()
    assert isinstance(count, int) and count >= 1, rule(
        "identity", f"an available backend reported device_count() == {count!r}"
    )
    current = accel_backend.current_device()
    assert 0 <= current < count, rule("identity", f"current_device() {current} not in range")
    accel_backend.set_device(current)
    assert accel_backend.device(current) == accel_backend.device(), rule(
        "identity", "device(current_device()) differs from device()"
    )


@pytest.mark.parametrize("index", [-1, 10_000])
def test_invalid_index(accel_backend: Accelerator, index: int) -> None:
    with pytest.raises(DeviceIndexError):
        accel_backend.device(index)
    with pytest.raises(DeviceIndexError):
        accel_backend.set_device(index)


def test_capability_flags_are_bools(accel_backend: Accelerator) -> None:
    for flag in CAPABILITY_FLAGS:
        value = getattr(accel_backend, flag)
        assert isinstance(value, bool), rule("capabilities", f"{flag} is {value!r}")
    assert accel_backend.is_available() is True, rule(
        "capabilities", "is_available() is not True on a backend selected as available"
    )


def test_queries_do_not_initialise(accel_backend: Accelerator) -> None:
    module = getattr(torch, accel_backend.device_type, None)
    is_initialized = getattr(module, "is_initialized", None)
    if not callable(is_initialized):
        pytest.skip(f"torch.{accel_backend.device_type} has no initialisation state to check.")
    if is_initialized():
        pytest.skip(
            f"torch.{accel_backend.device_type} already reports itself initialised (by an "
            "earlier test, or it needs no initialisation); run this test alone to check."
        )
    accel_backend.is_available()
    accel_backend.device_count()
    accel_backend.device()
    assert not is_initialized(), rule(
        "no-init", "is_available()/device_count()/device() initialised the device"
    )
