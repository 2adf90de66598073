"""Autocast state: captured as keywords, replayed later."""

from __future__ import annotations

import pytest
import torch

from accel import Accelerator
from accel.conformance import rule


def _low_precision(backend: Accelerator) -> torch.dtype:
    if backend.is_bf16_supported():
        return torch.bfloat16
    if backend.is_fp16_supported():
        return torch.float16
    pytest.skip(f"backend {backend.name!r} supports neither bfloat16 nor float16.")


def test_capture_outside_autocast(accel_backend: Accelerator) -> None:
    kwargs = accel_backend.autocast_kwargs()
    assert kwargs.get("device_type") == accel_backend.device_type, rule(
        "autocast-capture", f"device_type is {kwargs.get('device_type')!r}"
    )
    assert kwargs.get("enabled") is False, rule(
        "autocast-capture", "autocast reported enabled outside torch.autocast"
    )
    with torch.autocast(**kwargs):
        pass


def test_capture_inside_autocast(accel_backend: Accelerator) -> None:
    dtype = _low_precision(accel_backend)
    with torch.autocast(accel_backend.device_type, dtype=dtype):
        kwargs = accel_backend.autocast_kwargs()
    assert kwargs["enabled"] is True and kwargs["dtype"] == dtype, rule(
        "autocast-capture", f"inside autocast({dtype}) the kwargs were {kwargs}"
    )


@pytest.mark.accel_requires("tensors")
def test_replay_gives_same_dtypes(accel_backend: Accelerator) -> None:
    dtype = _low_precision(accel_backend)
    a = torch.randn(8, 8, device=accel_backend.device())
    with torch.autocast(accel_backend.device_type, dtype=dtype):
        kwargs = accel_backend.autocast_kwargs()
        inside = (a @ a).dtype
    with torch.autocast(**kwargs):
        replayed = (a @ a).dtype
    assert replayed == inside == dtype, rule(
        "autocast-replay", f"matmul gave {inside} under autocast, {replayed} on replay"
    )
