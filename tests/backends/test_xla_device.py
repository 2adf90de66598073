"""The xla backend on a real lazy runtime (PyTorch/XLA; CI uses its CPU client).

Run with ``PJRT_DEVICE=CPU pytest --accel=xla``; elsewhere every test skips with the
reason. What is checked here needs torch_xla itself: the lowered graph, torch_xla's
compile and transfer metrics, and torch's own checkpoint failing where accel's runs.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.utils.checkpoint
from torch import nn

from accel import Accelerator
from checkpointing import apply_activation_checkpointing, checkpoint, checkpoint_wrapper
from offload import Engine, OffloadModel, offload_parameters

pytestmark = pytest.mark.accel("xla")
MODES = [pytest.param(True, id="reentrant"), pytest.param(False, id="non_reentrant")]


def _metrics() -> Any:
    import torch_xla.debug.metrics as metrics

    return metrics


def _count(name: str) -> int:
    data = _metrics().metric_data(name)
    return int(data[0]) if data else 0


def _bytes(name: str) -> int:
    data = _metrics().metric_data(name)
    return int(data[1]) if data else 0


def _block() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Dropout(0.5), nn.Linear(64, 32))


def _hlo(tensors: list[torch.Tensor]) -> str:
    import torch_xla

    return str(torch_xla._XLAC._get_xla_tensors_hlo(tensors))


@pytest.mark.parametrize("reentrant", MODES)
def test_recomputation_sits_behind_an_optimisation_barrier(
    accel_backend: Accelerator, reentrant: bool
) -> None:
    device = accel_backend.device()
    torch.manual_seed(0)
    block = _block().to(device)
    x = torch.randn(8, 32).to(device).requires_grad_()
    accel_backend.mark_step()
    checkpoint(block, x, use_reentrant=reentrant, backend=accel_backend).sum().backward()
    assert x.grad is not None
    lowered = _hlo([x.grad])
    assert "opt-barrier" in lowered
    accel_backend.mark_step()
    # The plain step has no barrier: the one above is the checkpoint's.
    block(x).sum().backward()
    assert "opt-barrier" not in _hlo([x.grad])
    accel_backend.mark_step()


def test_torch_checkpoint_fails_where_accel_runs(accel_backend: Accelerator) -> None:
    device = accel_backend.device()
    block = _block().to(device)
    x = torch.randn(4, 32).to(device).requires_grad_()
    with pytest.raises(AttributeError, match="has no attribute 'xla'"):
        torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
    with pytest.raises(RuntimeError, match="torch has no module of `xla`"):
        torch.utils.checkpoint.checkpoint(
            block, x, use_reentrant=True, preserve_rng_state=False
        ).sum().backward()
    for reentrant in (True, False):
        checkpoint(block, x, use_reentrant=reentrant, backend=accel_backend).sum().backward()
    accel_backend.mark_step()


@pytest.mark.parametrize("reentrant", MODES)
def test_dropout_masks_replay_from_the_xla_seed(
    accel_backend: Accelerator, reentrant: bool
) -> None:
    # The input gradient of sum(dropout(x)) is the mask (0 or 2): exact on any device.
    def masked(v: torch.Tensor) -> torch.Tensor:
        return nn.functional.dropout(v * 1.0, p=0.5)

    grads = []
    for run in (masked, lambda v: checkpoint(masked, v, use_reentrant=reentrant)):
        x = torch.ones(2048, device=accel_backend.device(), requires_grad=True)
        accel_backend.manual_seed(17)
        torch.manual_seed(99)  # the CPU generator must not matter on xla
        run(x).sum().backward()  # no backend given: inferred from x's device
        assert x.grad is not None
        grads.append(x.grad.cpu())
    assert torch.equal(grads[0], grads[1])
    assert 0.3 < (grads[0] == 0).float().mean().item() < 0.7


def _train(
    backend: Accelerator, model: nn.Module, steps: int, step: Callable[[torch.Tensor], None]
) -> list[int]:
    """Run ``steps`` seeded steps; return the graphs compiled during each."""
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(2)).to(backend.device())
    x.requires_grad_()  # the reentrant variant needs an input that requires grad
    compiled = []
    for index in range(steps):
        before = _count("CompileTime")
        backend.manual_seed(100 + index)  # re-seeded: comparable runs (see README)
        step(x)
        backend.mark_step()
        compiled.append(_count("CompileTime") - before)
    return compiled


@pytest.mark.parametrize("reentrant", MODES)
def test_checkpointed_training_compiles_nothing_after_warm_up(
    accel_backend: Accelerator, reentrant: bool
) -> None:
    device = accel_backend.device()
    torch.manual_seed(0)
    plain = nn.Sequential(_block(), _block()).to(device)
    ckpt = copy.deepcopy(plain)
    apply_activation_checkpointing(ckpt, use_reentrant=reentrant, backend=accel_backend)
    results = []
    for model in (plain, ckpt):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

        def step(x: torch.Tensor, model: nn.Module = model, optimizer: Any = optimizer) -> None:
            model(x).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        compiled = _train(accel_backend, model, 5, step)
        results.append([p.detach().cpu() for p in model.parameters()])
        assert compiled[2:] == [0, 0, 0], compiled
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b)


def test_checkpoint_offload_to_cpu_moves_the_inputs(accel_backend: Accelerator) -> None:
    device = accel_backend.device()
    torch.manual_seed(0)
    block = checkpoint_wrapper(
        _block().to(device), offload_to_cpu=True, use_reentrant=False, backend=accel_backend
    )
    x = torch.randn(64, 32).to(device).requires_grad_()
    input_bytes = x.numel() * x.element_size()
    accel_backend.mark_step()
    moved = []
    for _ in range(3):
        inbound, outbound = _bytes("InboundData"), _bytes("OutboundData")
        block(x).sum().backward()
        accel_backend.mark_step()
        moved.append((_bytes("InboundData") - inbound, _bytes("OutboundData") - outbound))
    for to_host, to_device in moved:
        assert to_host >= input_bytes and to_device >= input_bytes, moved


def test_engine_trains_with_flat_compile_counts(accel_backend: Accelerator) -> None:
    device = accel_backend.device()
    torch.manual_seed(0)
    reference = nn.Sequential(_block(), _block()).to(device)
    model = copy.deepcopy(reference)
    apply_activation_checkpointing(model, use_reentrant=False, backend=accel_backend)
    engine = Engine(
        model,
        torch.optim.SGD(model.parameters(), lr=0.05),
        gradient_accumulation_steps=2,
        backend=accel_backend,
    )
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05)

    def engine_step(x: torch.Tensor) -> None:
        engine.backward(model(x).pow(2).mean())
        engine.step()

    def reference_step(x: torch.Tensor, count: list[int] = [0]) -> None:  # noqa: B006
        (reference(x).pow(2).mean() / 2).backward()
        count[0] += 1
        if count[0] % 2 == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    compiled = _train(accel_backend, model, 8, engine_step)
    _train(accel_backend, reference, 8, reference_step)
    # Warm-up is two accumulation cycles: the first micro-step after an optimizer step
    # reads parameters the optimizer wrote, a graph of its own the first time.
    assert compiled[4:] == [0, 0, 0, 0], compiled
    assert engine.global_steps == 4
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a.detach().cpu(), b.detach().cpu())


@pytest.mark.parametrize("wrapper", ["offload_model", "offload_parameters"])
def test_offload_moves_the_parameter_bytes_every_step_and_compiles_nothing_new(
    accel_backend: Accelerator, wrapper: str
) -> None:
    torch.manual_seed(0)
    layers = nn.Sequential(_block(), _block(), _block())
    if wrapper == "offload_model":
        model: nn.Module = OffloadModel(
            layers, num_slices=3, checkpoint_activation=True, backend=accel_backend
        )
        loads = 2  # forward, and the recomputation in backward
    else:
        offload_parameters(layers, backend=accel_backend)
        model, loads = layers, 1
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)  # steps on the host
    moved: list[tuple[int, int]] = []

    def step(x: torch.Tensor) -> None:
        to_device, to_host = _bytes("OutboundData"), _bytes("InboundData")
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        moved.append((_bytes("OutboundData") - to_device, _bytes("InboundData") - to_host))

    compiled = _train(accel_backend, model, 6, step)
    assert compiled[3:] == [0, 0, 0], compiled
    assert all(p.device.type == "cpu" for p in model.parameters())
    for to_device, to_host in moved:
        # The parameters come to the device each time they are used, their gradients go
        # back once; the rest is the batch, the checkpoints' inputs and the loss.
        assert loads * parameter_bytes <= to_device < (loads + 1) * parameter_bytes, moved
        assert parameter_bytes <= to_host < 2 * parameter_bytes, moved


def test_rng_state_is_the_xla_seed(accel_backend: Accelerator) -> None:
    import torch_xla.core.xla_model as xm

    accel_backend.manual_seed(12345)
    assert xm.get_rng_state(str(accel_backend.device())) == 12345
    state = accel_backend.get_rng_state()
    with accel_backend.fork_rng():
        accel_backend.manual_seed(1)
    assert torch.equal(accel_backend.get_rng_state(), state)
    assert accel_backend.compile_backend == "openxla"
    assert accel_backend.communication_backend == "xla"
    assert accel_backend.is_lazy and not accel_backend.supports_pinned_memory
