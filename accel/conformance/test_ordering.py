"""mark_step, the recompute barrier, synchronize, dtypes and the distributed backend."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import accel
from accel import Accelerator
from accel.conformance import rule


def test_mark_step_any_time(accel_backend: Accelerator) -> None:
    accel_backend.mark_step()
    with torch.no_grad():
        accel_backend.mark_step()
    leaf = torch.ones(3, requires_grad=True)
    calls: list[bool] = []

    def hook(grad: torch.Tensor) -> torch.Tensor:
        accel_backend.mark_step()
        calls.append(True)
        return grad

    leaf.register_hook(hook)
    (leaf * 2).sum().backward()
    assert calls and leaf.grad is not None and torch.equal(leaf.grad, torch.full((3,), 2.0)), rule(
        "mark-step", "mark_step() inside backward disturbed the gradient"
    )
    accel_backend.synchronize()


@pytest.mark.accel_requires("tensors")
def test_recompute_barrier_keeps_values_and_gradients(accel_backend: Accelerator) -> None:
    # Called as checkpointing calls it: on detached leaves and on a gradient, mid-graph.
    device = accel_backend.device()
    x = torch.arange(6.0).to(device).requires_grad_()
    grad = torch.full((6,), 3.0).to(device)
    accel.recompute_barrier(accel_backend, [])
    accel.recompute_barrier(accel_backend, [x, grad])
    y = (x * x).sum()
    y.backward()
    assert x.grad is not None and torch.equal(x.grad.cpu(), 2 * torch.arange(6.0)), rule(
        "recompute-barrier", "gradients through a tensor behind the barrier are wrong"
    )
    assert torch.equal(grad.cpu(), torch.full((6,), 3.0)), rule(
        "recompute-barrier", "the barrier changed a tensor's values"
    )
    member = getattr(accel_backend, "recompute_barrier", None)
    assert member is None or callable(member), rule(
        "recompute-barrier", f"recompute_barrier is {member!r}, not a method"
    )


def test_communication_backend(accel_backend: Accelerator) -> None:
    try:
        accel_backend.prepare_distributed()
    except accel.DistributedSetupError as exc:
        # A device torch has no communication backend for says so, and names none.
        name = accel_backend.communication_backend
        assert name == "undefined", rule(
            "distributed",
            f"prepare_distributed() raised ({exc}) but communication_backend is {name!r}, "
            "not 'undefined' (torch.distributed.Backend.UNDEFINED)",
        )
        assert str(exc).rstrip().endswith("."), rule(
            "distributed", f"prepare_distributed()'s error is not a sentence: {exc}"
        )
        return
    accel_backend.prepare_distributed()
    name = accel_backend.communication_backend
    known = {str(item).lower() for item in dist.Backend.backend_list}
    assert name in known, rule(
        "distributed",
        f"communication_backend {name!r} is not registered with torch.distributed after "
        f"prepare_distributed(); registered: {sorted(known)}",
    )


DTYPE_QUERIES = [(torch.bfloat16, "is_bf16_supported"), (torch.float16, "is_fp16_supported")]


@pytest.mark.parametrize(("dtype", "query"), DTYPE_QUERIES)
def test_dtype_support_is_bool(accel_backend: Accelerator, dtype: torch.dtype, query: str) -> None:
    supported = getattr(accel_backend, query)()
    assert isinstance(supported, bool), rule("dtypes", f"{query}() returned {supported!r}")


@pytest.mark.accel_requires("tensors")
@pytest.mark.parametrize(("dtype", "query"), DTYPE_QUERIES)
def test_dtype_support_holds(accel_backend: Accelerator, dtype: torch.dtype, query: str) -> None:
    if not getattr(accel_backend, query)():
        pytest.skip(f"{query}() is False.")
    a = torch.ones(4, 4, dtype=dtype, device=accel_backend.device())
    assert float((a @ a).sum().cpu()) == 64.0, rule("dtypes", f"{dtype} matmul is wrong")
