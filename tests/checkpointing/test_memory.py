"""Checkpointing saves memory, and gives it all back after backward."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch import nn

from accel import Accelerator
from checkpointing import (
    SavedTensorMeter,
    apply_activation_checkpointing,
    checkpoint,
    checkpoint_wrapper,
)
from checkpointing._non_reentrant import _Replay
from checkpointing._offload import HostCopy
from checkpointing._state import ForwardState

# Backend-generic tests put tensors on the backend's device.
pytestmark = pytest.mark.accel_requires("tensors")

MODES = [pytest.param(True, id="reentrant"), pytest.param(False, id="non_reentrant")]
TRACKED = (_Replay, ForwardState, HostCopy)


def _live() -> dict[str, int]:
    # Exact types: isinstance() on arbitrary objects can trigger deprecation warnings.
    counts = {cls.__name__: 0 for cls in TRACKED}
    for obj in gc.get_objects():
        kind = type(obj)
        if kind in TRACKED:
            counts[kind.__name__] += 1
    return counts


@contextmanager
def _gc_disabled() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _layer() -> nn.Module:
    return nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True)


def _nested(reentrant: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    inner = nn.Linear(16, 16)
    outer = nn.Linear(16, 16)

    def run(x: torch.Tensor) -> torch.Tensor:
        h = checkpoint(inner, x.sin(), use_reentrant=reentrant)
        return outer(h).relu()

    return lambda x: checkpoint(run, x, use_reentrant=reentrant)


def _function(reentrant: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    layer = _layer()
    return lambda x: checkpoint(layer, x, use_reentrant=reentrant)


CASES: dict[str, Callable[[bool], Callable[[torch.Tensor], Any]]] = {
    "function": _function,
    "wrapper": lambda r: checkpoint_wrapper(_layer(), use_reentrant=r),
    "offload": lambda r: checkpoint_wrapper(_layer(), offload_to_cpu=True, use_reentrant=r),
    "nested": _nested,
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("reentrant", MODES)
def test_nothing_outlives_backward(reentrant: bool, case: str) -> None:
    # Freed by reference counting alone: a cycle through autograd's C++ objects would
    # keep every recomputed activation alive, which the garbage collector cannot see.
    run = CASES[case](reentrant)
    gc.collect()
    with _gc_disabled():
        before = _live()
        for _ in range(3):
            x = torch.randn(2, 5, 16, requires_grad=True)
            run(x).sum().backward()
            del x
        after = _live()
    assert after == before


def test_retained_graph_is_freed_with_its_output() -> None:
    layer = _layer()
    gc.collect()
    with _gc_disabled():
        before = _live()
        out = checkpoint(layer, torch.randn(2, 5, 16, requires_grad=True), use_reentrant=False)
        loss = out.sum()
        loss.backward(retain_graph=True)
        assert _live()["_Replay"] == before["_Replay"] + 1
        del out, loss
        assert _live() == before


def _saved_activation_bytes(
    model: nn.Module, run: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor
) -> int:
    """Bytes of non-parameter storages autograd holds after the forward."""
    with SavedTensorMeter(exclude=model.parameters()) as meter:
        out = run(x)
    out.sum().backward()
    return meter.bytes


@pytest.mark.parametrize("reentrant", MODES)
def test_checkpointed_stack_keeps_only_block_inputs(
    accel_backend: Accelerator, reentrant: bool
) -> None:
    device = accel_backend.device()
    try:
        torch.empty(1, device=device).untyped_storage().data_ptr()
    except RuntimeError:
        pytest.skip(
            f"{device.type} tensors expose no storage (lazy tensors live in runtime "
            "buffers), and SavedTensorMeter counts storages; the lazy device's own "
            "tests measure its transfers instead."
        )
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), *(_layer() for _ in range(4))).to(device)
    x = torch.randn(4, 32, 16, device=device)
    plain = _saved_activation_bytes(model, model, x)
    apply_activation_checkpointing(
        model, check_fn=lambda m: isinstance(m, nn.TransformerEncoderLayer), use_reentrant=reentrant
    )
    checkpointed = _saved_activation_bytes(model, model, x)
    block_input = x.numel() * x.element_size()
    # The first linear saves x; each block keeps only its input.
    assert checkpointed <= 5 * block_input < plain / 4, (checkpointed, plain)
