"""An offloaded checkpoint input written in place after the forward raises, on any device.

Offloaded inputs bypass ``save_for_backward`` and autograd checks no version counter
through saved-tensor hooks, so the check is ours. Forcing the host-copy path on CPU
(the path a device takes) shows that it fires the same way without a device.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import checkpointing._non_reentrant as non_reentrant
import checkpointing._offload as offload
from accel import Accelerator
from backends.cpu import CpuBackend
from checkpointing import checkpoint_wrapper

AUTOGRAD_ERROR = "one of the variables needed for gradient computation has been modified"


@pytest.fixture
def forced_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    """Take the device path on CPU: every input is copied to a HostCopy and restored."""
    monkeypatch.setattr(offload, "_on_host", lambda tensor: False)
    monkeypatch.setattr(non_reentrant, "_on_device", lambda args, kwargs: True)


def _run(reentrant: bool, write_in_place: bool) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    layer = nn.Linear(8, 8)
    wrapped = checkpoint_wrapper(layer, offload_to_cpu=True, use_reentrant=reentrant)
    x = torch.randn(4, 8, requires_grad=True)
    h = x * 2
    y = wrapped(h)
    if write_in_place:
        h += y  # the residual written in place: x += attn(x)
    y.square().sum().backward()
    assert x.grad is not None and layer.weight.grad is not None
    return x.grad, layer.weight.grad


@pytest.mark.parametrize("reentrant", [False, True])
def test_in_place_write_after_forward_raises_like_autograd(
    forced_copies: None, reentrant: bool
) -> None:
    with pytest.raises(RuntimeError) as raised:
        _run(reentrant, write_in_place=True)
    message = str(raised.value)
    assert message.startswith(f"checkpointing: {AUTOGRAD_ERROR} by an inplace operation"), message
    assert "is at version 1; expected version 0 instead" in message, message
    assert "x = x + f(x)" in message, message


@pytest.mark.parametrize("reentrant", [False, True])
def test_torch_raises_the_same_on_the_host_path(reentrant: bool) -> None:
    # Without forcing, CPU inputs are saved as themselves and autograd's own check fires:
    # the forced (device) path above matches it.
    with pytest.raises(RuntimeError, match=AUTOGRAD_ERROR):
        _run(reentrant, write_in_place=True)


@pytest.mark.parametrize("reentrant", [False, True])
def test_untouched_input_restores_exactly(forced_copies: None, reentrant: bool) -> None:
    forced = _run(reentrant, write_in_place=False)
    torch.manual_seed(0)
    layer = nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    layer(x * 2).square().sum().backward()
    assert torch.equal(forced[0], x.grad) and torch.equal(forced[1], layer.weight.grad)


def test_witness_follows_views_and_holds_no_memory() -> None:
    base = torch.zeros(16)
    view = base[4:8]
    item = offload.copy_to_host(view, CpuBackend())
    assert item.witness is not None and item.witness.untyped_storage().nbytes() == 0
    offload.check_version(item)  # unchanged: no error
    base[0] = 1.0  # a write through the base bumps the shared counter, as autograd sees it
    with pytest.raises(RuntimeError, match="checkpointing: one of the variables"):
        offload.restore(item, CpuBackend())


@pytest.mark.accel("cuda")
@pytest.mark.parametrize("reentrant", [False, True])
def test_in_place_write_raises_on_cuda(accel_backend: Accelerator, reentrant: bool) -> None:
    # The real device path (side-stream copy to pinned memory), where autograd alone
    # would not notice the write.
    device = accel_backend.device()
    layer = nn.Linear(8, 8).to(device)
    wrapped = checkpoint_wrapper(
        layer, offload_to_cpu=True, use_reentrant=reentrant, backend=accel_backend
    )
    h = torch.randn(4, 8, device=device, requires_grad=True) * 2
    y = wrapped(h)
    h += y
    with pytest.raises(RuntimeError, match=f"checkpointing: {AUTOGRAD_ERROR}"):
        y.square().sum().backward()
