"""Pinned memory and memory statistics."""

from __future__ import annotations

import pytest
import torch

from accel import Accelerator
from accel.conformance import rule


def test_pin_memory_without_support_returns_input(accel_backend: Accelerator) -> None:
    if accel_backend.supports_pinned_memory:
        pytest.skip("this backend pins memory; see test_pin_memory_pins.")
    host = torch.arange(16, dtype=torch.float32)
    assert accel_backend.pin_memory(host) is host, rule(
        "pin-memory", "supports_pinned_memory is False, so pin_memory must return its input"
    )


# Pinned host memory is registered with the device runtime, so checking it needs a
# backend that can allocate on its device.
@pytest.mark.accel_requires("pinned_memory", "tensors")
def test_pin_memory_pins(accel_backend: Accelerator) -> None:
    host = torch.arange(16, dtype=torch.float32)
    pinned = accel_backend.pin_memory(host)
    assert torch.equal(pinned, host), rule("pin-memory", "values changed")
    assert pinned.is_pinned(), rule("pin-memory", "supports_pinned_memory but not pinned")
    assert accel_backend.pin_memory(pinned) is pinned, rule(
        "pin-memory", "pinning an already pinned tensor copied it"
    )


def _check_empty_pinned(backend: Accelerator) -> torch.Tensor:
    block = backend.empty_pinned((3, 5), torch.float16)
    assert isinstance(block, torch.Tensor), rule("empty-pinned", f"got {type(block).__name__}")
    assert block.device.type == "cpu", rule("empty-pinned", f"allocated on {block.device}")
    assert (tuple(block.shape), block.dtype) == ((3, 5), torch.float16), rule(
        "empty-pinned", f"asked for (3, 5) float16, got {tuple(block.shape)} {block.dtype}"
    )
    assert block.is_contiguous(), rule("empty-pinned", "the tensor is not contiguous")
    block.copy_(torch.ones(3, 5))
    assert bool((block == 1).all()), rule("empty-pinned", "the tensor does not hold writes")
    return block


def test_empty_pinned_without_support_is_plain_host_memory(accel_backend: Accelerator) -> None:
    if accel_backend.supports_pinned_memory:
        pytest.skip("this backend pins memory; see test_empty_pinned_is_pinned.")
    _check_empty_pinned(accel_backend)


@pytest.mark.accel_requires("pinned_memory", "tensors")
def test_empty_pinned_is_pinned(accel_backend: Accelerator) -> None:
    block = _check_empty_pinned(accel_backend)
    assert block.is_pinned(), rule("empty-pinned", "supports_pinned_memory but not pinned")


def _stats(backend: Accelerator) -> tuple[int, int]:
    return backend.memory_allocated(), backend.max_memory_allocated()


def test_memory_stats_types(accel_backend: Accelerator) -> None:
    accel_backend.empty_cache()
    accel_backend.reset_peak_memory_stats()
    allocated, peak = _stats(accel_backend)
    assert isinstance(allocated, int) and isinstance(peak, int), rule(
        "memory-stats", f"got {allocated!r}, {peak!r}"
    )
    assert 0 <= allocated <= peak or not accel_backend.supports_memory_stats, rule(
        "memory-stats", f"allocated {allocated} exceeds peak {peak}"
    )
    if not accel_backend.supports_memory_stats:
        assert (allocated, peak) == (0, 0), rule(
            "memory-stats", "supports_memory_stats is False, so the figures must be 0"
        )


@pytest.mark.accel_requires("memory_stats", "tensors")
def test_memory_stats_track_allocations(accel_backend: Accelerator) -> None:
    accel_backend.synchronize()
    before = accel_backend.memory_allocated()
    block = torch.empty(1 << 20, dtype=torch.uint8, device=accel_backend.device())
    accel_backend.synchronize()
    during = accel_backend.memory_allocated()
    assert during - before >= block.numel(), rule(
        "memory-stats",
        f"allocating {block.numel()} bytes moved memory_allocated by {during - before}",
    )
    assert accel_backend.max_memory_allocated() >= during, rule(
        "memory-stats", "max_memory_allocated() is below memory_allocated()"
    )
    del block
    accel_backend.reset_peak_memory_stats()
    assert accel_backend.max_memory_allocated() < during, rule(
        "memory-stats", "reset_peak_memory_stats() did not lower the peak"
    )
