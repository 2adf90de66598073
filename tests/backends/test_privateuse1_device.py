"""The generic PrivateUse1 backend on a real PrivateUse1 device, against the plain model.

CI's openreg cell builds PyTorch's reference device (``torch_openreg``: device memory
walled off from the host, streams on worker threads, random operators drawing from the
CPU generator, no memory statistics, no communication backend) and runs these with
``--accel=openreg``. Elsewhere no device has joined torch through PrivateUse1 and they
skip, saying so. The device's kernels are the host's, so parity is bit-exact.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import pytest
import torch
from torch import nn

import accel
import accel.distributed
from accel import _compat
from backends.privateuse1 import PrivateUse1Backend
from backends.recording import RecordingBackend
from checkpointing import apply_activation_checkpointing, checkpoint, checkpoint_sequential
from checkpointing._measure import LiveActivationMeter
from offload import OffloadModel, State


@pytest.fixture
def backend(privateuse1_device: str) -> PrivateUse1Backend:
    found = accel.get_backend(privateuse1_device)
    assert isinstance(found, PrivateUse1Backend)
    return found


def _run(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_auto_detection_picks_it_without_initialising_it(backend: PrivateUse1Backend) -> None:
    name = backend.name
    out = _run(
        "import json, torch, accel\n"
        "rows = accel.list_backends()\n"
        "picked = accel.get_backend()\n"
        "picked.device(); picked.device_count(); picked.is_available()\n"
        f"print(json.dumps([picked.name, torch.{name}.is_initialized(),\n"
        "    [r.device_count for r in rows if r.name == picked.name]]))\n"
    )
    assert json.loads(out) == [name, False, [backend.device_count()]]


def test_the_listing_and_accel_select_it(backend: PrivateUse1Backend) -> None:
    report = json.loads(_run("from accel._cli import main; main(['--json'])"))
    assert report["selected"] == {"name": backend.name, "reason": "auto", "skipped": []}
    row = next(r for r in report["backends"] if r["name"] == backend.name)
    assert row["available"] and row["provider"] == "built-in"
    out = _run("import os, accel; os.environ['ACCEL'] = 'cpu'; print(accel.get_backend().name)")
    assert out.strip() == "cpu"


def test_capabilities_are_found_out(backend: PrivateUse1Backend) -> None:
    memory = _compat.accelerator_function("memory_allocated")
    try:
        answers = memory is not None and memory() >= 0
    except RuntimeError:
        answers = False
    assert backend.supports_memory_stats is answers
    if not answers:
        assert backend.memory_allocated() == 0 and backend.max_memory_allocated() == 0
        backend.reset_peak_memory_stats()
        backend.empty_cache()
    assert backend.supports_streams and backend.supports_pinned_memory
    assert backend.empty_pinned((4,), torch.float32).is_pinned()
    assert backend.pin_memory(torch.ones(3)).is_pinned()


def test_distributed_without_a_communication_backend_is_a_sentence(
    backend: PrivateUse1Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    if _compat.default_communication_backend(backend.device_type) is not None:
        pytest.skip(f"torch maps {backend.device_type!r} to a communication backend here.")
    assert backend.communication_backend == "undefined"
    with pytest.raises(accel.DistributedSetupError, match="has no communication backend"):
        accel.distributed.init_process_group(accel_backend=backend, world_size=1, rank=0)
    assert not torch.distributed.is_initialized()


def test_streams_order_a_side_stream_copy(backend: PrivateUse1Backend) -> None:
    device = backend.device()
    side = backend.Stream()
    assert side != backend.current_stream()
    source = torch.arange(1024.0, device=device)
    host = backend.empty_pinned((1024,), torch.float32)
    side.wait_stream(backend.current_stream())
    with backend.stream(side):
        host.copy_(source * 2, non_blocking=True)
        done = side.record_event()
    backend.record_stream(source, side)
    done.synchronize()
    assert torch.equal(host, torch.arange(1024.0) * 2)
    backend.synchronize()


def test_random_ops_and_the_seed(backend: PrivateUse1Backend) -> None:
    ones = torch.ones(2048, device=backend.device())
    backend.manual_seed(3)
    first = nn.functional.dropout(ones, 0.5).cpu()
    backend.manual_seed(3)
    assert torch.equal(nn.functional.dropout(ones, 0.5).cpu(), first)
    # openreg's random operators draw from the CPU generator: found out, not assumed.
    assert isinstance(backend.random_ops_draw_from_cpu(), bool)


def _mlp(width: int = 32) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        *(
            nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Dropout(0.3))
            if index % 2 == 0
            else nn.Sequential(nn.Linear(2 * width, width), nn.Tanh(), nn.Dropout(0.1))
            for index in range(6)
        )
    )


def _step(
    backend: PrivateUse1Backend, model: nn.Module, forward: Callable[[torch.Tensor], torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(1)).to(backend.device())
    x.requires_grad_(True)
    backend.manual_seed(9)
    out = forward(x)
    out.square().mean().backward()
    assert x.grad is not None
    grads = [p.grad.cpu() for p in model.parameters() if p.grad is not None]
    return (
        out.detach().cpu(),
        x.grad.cpu(),
        *grads,
        torch.get_rng_state(),
        backend.get_rng_state(),
    )


def _assert_equal(actual: tuple[torch.Tensor, ...], expected: tuple[torch.Tensor, ...]) -> None:
    assert len(actual) == len(expected)
    for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert torch.equal(a, e), f"item {index} differs"


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_both_checkpoint_variants_are_exact_with_dropout(
    backend: PrivateUse1Backend, reentrant: bool
) -> None:
    plain = _mlp().to(backend.device())
    expected = _step(backend, plain, plain)
    model = _mlp().to(backend.device())
    actual = _step(
        backend, model, lambda x: checkpoint(model, x, use_reentrant=reentrant, backend=backend)
    )
    _assert_equal(actual, expected)
    sequential = _mlp().to(backend.device())
    run = _step(
        backend,
        sequential,
        lambda x: checkpoint_sequential(sequential, 3, x, use_reentrant=reentrant),
    )
    _assert_equal(run, expected)


def test_the_memory_budget_planner_is_exact_and_fits(backend: PrivateUse1Backend) -> None:
    device = backend.device()
    plain = _mlp().to(device)
    expected = _step(backend, plain, plain)
    model = _mlp().to(device)
    # The step's input needs grad, so the example does too (the plan depends on it).
    x = torch.randn(8, 32, device=device, requires_grad=True)
    wrapped = apply_activation_checkpointing(
        model,
        memory_budget=0.5,
        example_inputs=(x,),
        backend=backend,
    )
    assert wrapped
    _assert_equal(_step(backend, model, model), expected)

    def live(module: nn.Module) -> int:
        with LiveActivationMeter(exclude=[*module.parameters(), *module.buffers()]) as meter:
            out = module(x)
        return meter.bytes - out.untyped_storage().nbytes()

    assert live(model) <= 0.5 * live(plain)


@pytest.mark.parametrize("checkpoint_activation", [False, True], ids=["plain", "checkpointed"])
def test_offload_model_trains_like_the_plain_model(
    backend: PrivateUse1Backend, checkpoint_activation: bool
) -> None:
    device = backend.device()
    plain = _mlp().to(device)
    model = OffloadModel(
        _mlp(), num_slices=3, checkpoint_activation=checkpoint_activation, backend=backend
    )
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        expected = _step(backend, plain, plain)
        actual = _step(backend, model, model)
        _assert_equal(actual, expected)
        plain_opt.step()
        opt.step()
        plain_opt.zero_grad()
        opt.zero_grad()
    for got, want in zip(model.parameters(), plain.parameters(), strict=True):
        assert got.device.type == "cpu" and torch.equal(got, want.cpu())


def test_offload_model_prefetches_the_next_slice_on_a_side_stream(
    backend: PrivateUse1Backend,
) -> None:
    # torch refuses a PrivateUse1 tensor as a host parameter's .data, so offload copies;
    # with streams, the next slice's copy runs on the copy stream while a slice computes.
    recording = RecordingBackend(backend)
    model = OffloadModel(_mlp(), num_slices=3, backend=recording)
    assert model.strategy_name == "copy-parameters"
    plain = _mlp().to(backend.device())
    recording.clear()
    _assert_equal(_step(backend, model, model), _step(backend, plain, plain))
    assert recording.count("stream") >= 2  # slices 1 and 2 came ahead, on the copy stream
    assert recording.count("record_stream") >= 2  # their copies marked as used by compute
    assert model.state is State.IDLE and model.is_home()
