"""Per-device generators, the backend's torch.compile backend and its attention kernel."""

from __future__ import annotations

import pytest
import torch

import accel
from accel import Accelerator, DeviceIndexError
from accel.conformance import rule


def test_rng_state_by_index(accel_backend: Accelerator) -> None:
    count = accel_backend.device_count()
    if count < 1:
        pytest.skip("the backend sees no device")
    for index in range(count):
        state = accel_backend.get_rng_state(index)
        assert isinstance(state, torch.Tensor) and state.dtype == torch.uint8, rule(
            "rng-devices", f"get_rng_state({index}) returned {type(state).__name__}"
        )
        accel_backend.set_rng_state(state, index)
        assert torch.equal(accel_backend.get_rng_state(index), state), rule(
            "rng-devices", f"set_rng_state(state, {index}) did not restore device {index}"
        )
    with pytest.raises(DeviceIndexError):
        accel_backend.get_rng_state(count)


def test_fork_rng_over_devices(accel_backend: Accelerator) -> None:
    devices = list(range(accel_backend.device_count()))
    if not devices:
        pytest.skip("the backend sees no device")
    before = [accel_backend.get_rng_state(index) for index in devices]
    with accel_backend.fork_rng(devices=devices):
        accel_backend.manual_seed(12345)
        for index in devices:
            accel_backend.set_rng_state(accel_backend.get_rng_state(), index)
    for index in devices:
        assert torch.equal(accel_backend.get_rng_state(index), before[index]), rule(
            "fork-rng", f"fork_rng(devices={devices}) did not restore device {index}"
        )


def test_compile_backend_is_known_to_torch(accel_backend: Accelerator) -> None:
    name = accel_backend.compile_backend
    assert isinstance(name, str) and name, rule("compile-backend", f"got {name!r}")
    known = torch._dynamo.list_backends(exclude_tags=())
    assert name in known, rule(
        "compile-backend", f"{name!r} is not a registered torch.compile backend ({known})"
    )


@pytest.mark.accel_requires("tensors")
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::RuntimeWarning")
def test_compile_backend_compiles(accel_backend: Accelerator) -> None:
    linear = torch.nn.Linear(8, 8).to(accel_backend.device())
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)).to(accel_backend.device())
    torch._dynamo.reset()
    compiled = torch.compile(linear, backend=accel_backend.compile_backend)
    try:
        out = compiled(x).cpu()
    finally:
        torch._dynamo.reset()
        torch.set_flush_denormal(False)  # see test_checkpoint.py: torch 2.4's inductor
    assert torch.allclose(out, linear(x).cpu(), atol=1e-5), rule(
        "compile-backend", "the compiled module's output differs from the eager one"
    )


def test_attention_kernel(accel_backend: Accelerator) -> None:
    # Asked as the planner asks it: about tensors that hold no data (meta here, fake
    # there), with and without dropout, a mask and grouped query heads.
    def meta(heads: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(2, heads, 16, 64, device="meta", dtype=dtype).requires_grad_()

    mask = torch.empty(2, 1, 16, 16, device="meta", dtype=torch.bool)
    for dtype in (torch.float32, torch.float16):
        query, key = meta(4, dtype), meta(2, dtype)
        calls = [
            (query, query, query, None, 0.0, False, False),
            (query, query, query, mask, 0.1, False, False),
            (query, key, key, None, 0.1, True, True),
        ]
        for call in calls:
            kernel = accel.attention_kernel(accel_backend, *call)
            assert kernel is None or kernel in accel.ATTENTION_KERNELS, rule(
                "attention-kernel", f"attention_kernel() answered {kernel!r}"
            )
