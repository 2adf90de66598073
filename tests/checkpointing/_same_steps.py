"""Training steps of a planned model held against the plain model's, bit for bit.

Loaded by ``tests/conftest.py`` as ``_same_steps`` for the saved-tensor grain's tests.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn


def step(model: nn.Module, *inputs: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One training step from a fixed generator state: the loss and the gradients."""
    torch.manual_seed(7)
    loss = model(*inputs).square().mean()
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def assert_same_steps(model: nn.Module, reference: nn.Module, *inputs: torch.Tensor) -> None:
    """Three steps (a planned call's first is checked, the others not) equal to the
    reference's, losses, gradients and buffers, with no warning of ours (no call falls
    back to a whole checkpoint; torch's own deprecation warnings pass)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="checkpointing:")
        for _ in range(3):
            loss, grads = step(model, *inputs)
            expected_loss, expected_grads = step(reference, *inputs)
            assert torch.equal(loss, expected_loss)
            assert len(grads) == len(expected_grads)
            assert all(torch.equal(a, b) for a, b in zip(grads, expected_grads, strict=True))
    buffers = [b for _, b in model.named_buffers()]
    expected = [b for _, b in reference.named_buffers()]
    assert len(buffers) == len(expected)
    assert all(torch.equal(a, b) for a, b in zip(buffers, expected, strict=True))
