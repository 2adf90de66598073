"""Activation checkpointing replays dropout exactly on the device.

``checkpointing`` restores the generator states it captured through the backend
before recomputing, so dropout inside a checkpoint must give the plain run's outputs
and gradients. The comparison is exact (``torch.equal``) on every device: the
recomputation runs the same deterministic kernels (linear, GELU, dropout) on the same
inputs with the same generator state, and each parameter receives its gradient once.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.utils.checkpoint
from torch import nn

from accel import Accelerator, _compat
from accel.conformance import rule
from checkpointing import checkpoint

SEED = 2024


def _model(backend: Accelerator) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(32, 64), nn.GELU(), nn.Dropout(0.5), nn.Linear(64, 32), nn.Dropout(0.25)
    ).to(backend.device())


def _step(
    backend: Accelerator, model: nn.Module, x: torch.Tensor, use_reentrant: bool | None
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    x = x.detach().clone().requires_grad_()
    torch.manual_seed(SEED)
    backend.manual_seed(SEED)
    if use_reentrant is None:
        out = model(x)
    else:
        out = checkpoint(model, x, use_reentrant=use_reentrant, backend=backend)
    (out * out).sum().backward()
    assert x.grad is not None
    grads = [p.grad.detach().cpu() for p in model.parameters() if p.grad is not None]
    return out.detach().cpu(), x.grad.detach().cpu(), grads


@pytest.mark.accel_requires("tensors")
@pytest.mark.parametrize("use_reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_dropout_in_checkpoint_matches_plain_run(
    accel_backend: Accelerator, use_reentrant: bool
) -> None:
    model = _model(accel_backend).train()
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1)).to(accel_backend.device())
    plain_out, plain_x_grad, plain_grads = _step(accel_backend, copy.deepcopy(model), x, None)
    out, x_grad, grads = _step(accel_backend, copy.deepcopy(model), x, use_reentrant)

    mode = "reentrant" if use_reentrant else "non-reentrant"
    assert torch.equal(out, plain_out), rule(
        "checkpoint-dropout", f"{mode}: the checkpointed forward differs from the plain one"
    )
    assert torch.equal(x_grad, plain_x_grad), rule(
        "checkpoint-dropout",
        f"{mode}: the input gradient differs: the recomputation drew another dropout mask, "
        "so set_rng_state(get_rng_state()) does not restore the generator dropout uses",
    )
    assert len(grads) == len(plain_grads) and all(
        torch.equal(a, b) for a, b in zip(grads, plain_grads, strict=True)
    ), rule("checkpoint-dropout", f"{mode}: the parameter gradients differ from the plain run's")


def _compiled_step(
    backend: Accelerator, run: Any, compile_backend: str, reentrant: bool
) -> tuple[torch.Tensor, ...]:
    model = _model(backend).train()
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1)).to(backend.device())
    x.requires_grad_()
    torch._dynamo.reset()
    step = torch.compile(
        lambda v: run(model, v, use_reentrant=reentrant).sum(),
        backend=compile_backend,
        fullgraph=True,
    )
    torch.manual_seed(SEED)
    backend.manual_seed(SEED)
    try:
        step(x).backward()
    finally:
        torch._dynamo.reset()
        # inductor's CPU kernels (-ffast-math) turn on flush-to-zero for the whole process
        # on torch 2.4; later checks must not run with it.
        torch.set_flush_denormal(False)
    assert x.grad is not None
    grads = [p.grad.detach().cpu() for p in model.parameters() if p.grad is not None]
    return (x.grad.detach().cpu(), *grads)


@pytest.mark.accel_requires("tensors")
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::RuntimeWarning")
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
@pytest.mark.parametrize("use_reentrant", [True, False], ids=["reentrant", "non_reentrant"])
@pytest.mark.parametrize("compile_with", ["aot_eager", "device"])
def test_compiled_checkpoint_matches_torchs(
    accel_backend: Accelerator, use_reentrant: bool, compile_with: str
) -> None:
    compile_backend = accel_backend.compile_backend if compile_with == "device" else compile_with
    theirs = _compiled_step(
        accel_backend, torch.utils.checkpoint.checkpoint, compile_backend, use_reentrant
    )
    ours = _compiled_step(accel_backend, checkpoint, compile_backend, use_reentrant)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True)), rule(
        "checkpoint-compile",
        f"with backend={compile_backend!r}, compiled gradients differ from those of torch's "
        "own checkpoint compiled the same way",
    )


@pytest.mark.accel_requires("tensors")
def test_vmap_over_checkpoint(accel_backend: Accelerator) -> None:
    if not _compat.checkpoint_supports_vmap():
        pytest.skip(f"torch {torch.__version__}'s own checkpoint does not support vmap")
    weight = torch.randn(8, 8, generator=torch.Generator().manual_seed(3)).to(
        accel_backend.device()
    )

    def fn(v: torch.Tensor) -> torch.Tensor:
        return torch.tanh(v @ weight).sum()

    xs = torch.randn(4, 8, generator=torch.Generator().manual_seed(4)).to(accel_backend.device())
    got = torch.func.vmap(lambda v: checkpoint(fn, v, use_reentrant=False))(xs)
    assert torch.equal(got.cpu(), torch.func.vmap(fn)(xs).cpu()), rule(
        "checkpoint-vmap", "vmap over the checkpoint gave other values than vmap over the function"
    )
