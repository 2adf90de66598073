"""Offload on a device whose tensors cannot stand in for host ones: parameters as copies.

On such a device (PyTorch/XLA's) torch refuses to point a host parameter's ``.data`` at a
device tensor, so offload loads parameters as differentiable copies
(:mod:`offload._core.copies`). These tests run on every selected backend through the pytest
plugin: on ``xla`` and ``openreg`` the path is the device's own; on a backend that can
swap ``.data`` (cpu, cuda) it is forced, so the path is tested, bit-exact on the host, in
every CI cell and on a GPU. The reference is
always the plain model on the same device, with dropout drawn from the same seed.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import offload._core.strategy
from accel import Accelerator
from checkpointing import apply_activation_checkpointing
from offload import (
    Engine,
    OffloadConfigError,
    OffloadModel,
    ParameterOffload,
    State,
    offload_parameters,
)
from offload._params.copied import CopyParameters


@pytest.fixture
def backend(accel_backend: Accelerator, monkeypatch: pytest.MonkeyPatch) -> Accelerator:
    """The backend under test, with offload on its copying path."""
    strategy = offload._core.strategy
    if strategy.choose(accel_backend.device()) != strategy.COPY_PARAMETERS:
        monkeypatch.setattr(strategy, "choose", lambda device, home=None: strategy.COPY_PARAMETERS)
    return accel_backend


def _exact(backend: Accelerator) -> dict[str, float]:
    """Bit-exact on the host and on PyTorch's reference device (its kernels are the host's);
    float rounding on a compiled device."""
    return {"rtol": 0.0, "atol": 0.0} if backend.device_type in ("cpu", "openreg") else {}


def _block(width: int = 16) -> nn.Module:
    return nn.Sequential(
        nn.Linear(width, 2 * width), nn.GELU(), nn.Dropout(0.5), nn.Linear(2 * width, width)
    )


def _layers() -> list[nn.Module]:
    torch.manual_seed(0)
    return [_block(), _block(), nn.BatchNorm1d(16), _block(), nn.Linear(16, 4)]


def _step(backend: Accelerator, model: nn.Module, x: torch.Tensor, seed: int = 7) -> torch.Tensor:
    backend.manual_seed(seed)
    out: torch.Tensor = model(x)
    out.pow(2).mean().backward()
    backend.mark_step()
    return out.detach().cpu()


def _grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().cpu() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("checkpoint_activation", [False, True], ids=["plain", "checkpointed"])
@pytest.mark.parametrize("num_microbatches", [1, 2])
def test_offload_model_equals_the_plain_model(
    backend: Accelerator, checkpoint_activation: bool, num_microbatches: int
) -> None:
    device = backend.device()
    layers = _layers()
    plain = nn.Sequential(*copy.deepcopy(layers)).to(device)
    model = OffloadModel(
        nn.Sequential(*layers),
        num_slices=3,
        checkpoint_activation=checkpoint_activation,
        num_microbatches=num_microbatches,
        backend=backend,
    )
    assert model.strategy_name == "copy-parameters"
    buffers = list(model.buffers())
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1)).to(device)
    if num_microbatches == 1:
        expected = _step(backend, plain, x)
        torch.testing.assert_close(_step(backend, model, x), expected, **_exact(backend))
        torch.testing.assert_close(_grads(model), _grads(plain), **_exact(backend))
    else:  # batch norm and dropout see each micro-batch alone: compare with a plain loop
        model(x).pow(2).mean().backward()
        assert all(p.grad is not None for p in model.parameters())
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert all(p.grad is None or p.grad.device.type == "cpu" for p in model.parameters())
    # The host buffers themselves, updated in place (a recomputation must not leave its
    # device copies behind, nor a stray clone).
    assert all(a is b for a, b in zip(model.buffers(), buffers, strict=True))
    assert all(b.device.type == "cpu" for b in buffers)
    assert model.state is State.IDLE and model.is_home()
    if num_microbatches == 1:
        stats = [b.cpu() for b in plain[2].buffers()]
        torch.testing.assert_close([b for b in model.module[2].buffers()], stats)


def test_engine_accumulates_like_plain_training(backend: Accelerator) -> None:
    device = backend.device()
    layers = _layers()
    plain = nn.Sequential(*copy.deepcopy(layers)).to(device)
    model = OffloadModel(
        nn.Sequential(*layers), num_slices=2, checkpoint_activation=True, backend=backend
    )
    engine = Engine(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        gradient_accumulation_steps=2,
        backend=backend,
    )
    reference = torch.optim.SGD(plain.parameters(), lr=0.1)
    data = torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(3))
    for index, x in enumerate(data):
        backend.manual_seed(index)
        engine.backward(model(x.to(device)).pow(2).mean())
        engine.step()
        backend.manual_seed(index)
        (plain(x.to(device)).pow(2).mean() / 2).backward()
        if index % 2 == 1:
            reference.step()
            reference.zero_grad(set_to_none=True)
        backend.mark_step()
    assert engine.global_steps == 2
    torch.testing.assert_close(
        [p.detach() for p in model.parameters()],
        [p.detach().cpu() for p in plain.parameters()],
        **_exact(backend),
    )


class _Tied(nn.Module):
    """A model we did not shape for offload: tied embedding, residual blocks, norms."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(20, 16)
        self.blocks = nn.ModuleList(_block() for _ in range(3))
        self.norm = nn.LayerNorm(16)
        self.bn = nn.BatchNorm1d(16)
        self.head = nn.Linear(16, 20, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(ids)
        for block in self.blocks:
            hidden = hidden + block(hidden)
        out: torch.Tensor = self.head(self.bn(self.norm(hidden)))
        return out


def _plain_on(model: _Tied, device: torch.device) -> _Tied:
    plain = copy.deepcopy(model).to(device)
    # On a device whose tensors cannot take a host tensor's place, .to() makes a new
    # Parameter per use, so ties must be made again (PyTorch/XLA's documented advice).
    plain.head.weight = plain.embed.weight
    return plain


CHECKPOINTING: dict[str, Callable[[nn.Module, Accelerator], None]] = {
    "plain": lambda model, backend: None,
    "reentrant": lambda model, backend: apply_activation_checkpointing(
        model, check_fn=lambda m: isinstance(m, nn.Sequential), use_reentrant=True, backend=backend
    ),
    "non_reentrant": lambda model, backend: apply_activation_checkpointing(
        model, check_fn=lambda m: isinstance(m, nn.Sequential), use_reentrant=False, backend=backend
    ),
}


@pytest.mark.parametrize("checkpointing", list(CHECKPOINTING))
def test_offload_parameters_equals_the_plain_model(
    backend: Accelerator, checkpointing: str
) -> None:
    device = backend.device()
    model = _Tied()
    plain = _plain_on(model, device)
    CHECKPOINTING[checkpointing](model, backend)
    handle = offload_parameters(model, backend=backend)
    assert isinstance(handle.strategy, CopyParameters) and ParameterOffload.of(model) is handle
    assert handle.strategy_name == "copy-parameters"
    ids = torch.randint(0, 20, (8,), generator=torch.Generator().manual_seed(2)).to(device)
    for step in range(2):
        torch.testing.assert_close(
            _step(backend, model, ids, seed=step), _step(backend, plain, ids, seed=step)
        )
    # The tied weight sums two uses in another order: float rounding, not bit-exactness.
    torch.testing.assert_close(_grads(model), _grads(plain))
    assert handle.is_home() and handle.state is State.IDLE
    assert handle.execution_order[0] == "module 'embed' (Embedding)"
    assert handle.backward_order[0] == "module 'head' (Linear)"
    assert handle.max_resident >= 1 and handle.resident_modules == ()
    assert all(b.device == device for b in model.buffers())
    handle.remove()
    assert ParameterOffload.of(model) is None
    assert all(t.device.type == "cpu" for t in [*model.parameters(), *model.buffers()])
    torch.testing.assert_close(model.bn.running_mean, plain.bn.running_mean.cpu())
    assert model.head.weight is model.embed.weight


def test_a_failed_forward_leaves_every_parameter_in_place(backend: Accelerator) -> None:
    device = backend.device()
    model = _Tied()
    parameters = dict(model.named_parameters())
    handle = offload_parameters(model, backend=backend)

    def fail(module: nn.Module, args: Any) -> None:
        raise RuntimeError("boom")

    hook = model.blocks[1].register_forward_pre_hook(fail)
    with pytest.raises(RuntimeError, match="boom"):
        model(torch.zeros(4, dtype=torch.long).to(device))
    hook.remove()
    handle.recover()
    assert dict(model.named_parameters()) == parameters and handle.is_home()
    _step(backend, model, torch.zeros(4, dtype=torch.long).to(device))
    assert all(p.grad is not None and p.grad.device.type == "cpu" for p in model.parameters())


def test_parameters_away_from_the_host_are_refused(backend: Accelerator) -> None:
    # On the host, the meta device stands in for device memory.
    away = "meta" if backend.device_type == "cpu" else backend.device()
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)).to(away)
    for wrap in (
        lambda: OffloadModel(model, num_slices=2, backend=backend),
        lambda: offload_parameters(model, backend=backend),
    ):
        with pytest.raises(OffloadConfigError, match=r"keeps them in host memory.*model\.cpu\(\)"):
            wrap()
    assert ParameterOffload.of(model) is None
