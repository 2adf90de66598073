"""Activation checkpointing replays dropout exactly on the device.

``checkpointing`` restores the generator states it captured through the backend
before recomputing, so dropout inside a checkpoint must give the plain run's outputs
and gradients. On an eager device the comparison is exact (``torch.equal``): the
recomputation runs the same deterministic kernels (linear, GELU, dropout) on the same
inputs with the same generator state, and each parameter receives its gradient once.
A lazy device compiles the checkpointed step into other graphs than the plain step
(the recomputation is fused differently), so there gradients agree to float rounding
(``torch.testing.assert_close``'s defaults); the masks themselves are compared exactly
on every device, through a function whose input gradient is its dropout mask.
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
    same = torch.equal if not accel_backend.is_lazy else _close
    assert torch.equal(out, plain_out), rule(
        "checkpoint-dropout", f"{mode}: the checkpointed forward differs from the plain one"
    )
    assert same(x_grad, plain_x_grad), rule(
        "checkpoint-dropout",
        f"{mode}: the input gradient differs: the recomputation drew another dropout mask, "
        "so set_rng_state(get_rng_state()) does not restore the generator dropout uses",
    )
    assert len(grads) == len(plain_grads) and all(
        same(a, b) for a, b in zip(grads, plain_grads, strict=True)
    ), rule("checkpoint-dropout", f"{mode}: the parameter gradients differ from the plain run's")


def _close(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    try:
        torch.testing.assert_close(actual, expected)
    except AssertionError:
        return False
    return True


@pytest.mark.accel_requires("tensors")
@pytest.mark.parametrize("use_reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_recomputed_dropout_mask_is_the_forward_mask(
    accel_backend: Accelerator, use_reentrant: bool
) -> None:
    # d(sum(dropout(x) * 2))/dx is the mask times 2 / (1 - p): exact on every device.
    def masked(v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(v, p=0.5, training=True) * 2.0

    masks = []
    for run in (
        masked,
        lambda v: checkpoint(masked, v, use_reentrant=use_reentrant, backend=accel_backend),
    ):
        x = torch.ones(4096, device=accel_backend.device(), requires_grad=True)
        accel_backend.manual_seed(SEED)
        run(x).sum().backward()
        assert x.grad is not None
        masks.append(x.grad.detach().cpu())
    assert torch.equal(masks[0], masks[1]), rule(
        "checkpoint-dropout",
        f"{'reentrant' if use_reentrant else 'non-reentrant'}: the recomputation's dropout "
        "mask differs from the forward's",
    )


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
    try:
        theirs = _compiled_step(
            accel_backend, torch.utils.checkpoint.checkpoint, compile_backend, use_reentrant
        )
    except Exception as exc:  # torch's own failure: nothing to compare ours with
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        pytest.skip(
            f"torch {torch.__version__}'s own checkpoint does not compile with dropout on "
            f"{accel_backend.device_type} tensors ({type(exc).__name__}: {first_line})"
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
