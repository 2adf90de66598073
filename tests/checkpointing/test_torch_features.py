"""torch's checkpoint features beyond errors: saved inputs, GraphExecGroup, selective
checkpointing, the devices' generators, rebinding, and torch 2.15's additions.

Where torch defines the behaviour, the same scenario runs through torch's checkpoint and
ours, so each test holds on every supported torch release.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.utils.checkpoint as torch_checkpoint
from torch import nn

from accel import _compat
from accel.testing import RecordingBackend
from backends.cpu import CpuBackend
from checkpointing import checkpoint, checkpoint_sequential, checkpoint_wrapper

CHECKPOINTS = [
    pytest.param(torch_checkpoint.checkpoint, id="torch"),
    pytest.param(checkpoint, id="accel"),
]


# Saved inputs, GraphExecGroup, selective checkpointing --------------------------------------


@pytest.mark.parametrize("offload", [False, True], ids=["kept", "offload_to_cpu"])
def test_input_without_grad_comes_back_as_the_same_object(offload: bool) -> None:
    seen: list[torch.Tensor] = []
    linear = nn.Linear(3, 3)

    class Block(nn.Module):
        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            seen.append(mask)
            return linear(x) * mask

    x = torch.randn(2, 3, requires_grad=True)
    mask = torch.ones(2, 3)
    checkpoint_wrapper(Block(), offload_to_cpu=offload)(x, mask).sum().backward()
    assert len(seen) == 2 and seen[1] is mask


@pytest.mark.skipif(
    _compat.graph_exec_group() is None,
    reason=f"torch {torch.__version__} has no torch.utils.checkpoint.GraphExecGroup "
    "(absent from 2.4.1, present in 2.13)",
)
@pytest.mark.parametrize("run", CHECKPOINTS)
def test_graph_exec_group_recomputes_once(run: Callable[..., Any]) -> None:
    calls = [0]

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        calls[0] += 1
        return x.sin(), x.cos()

    group = _compat.graph_exec_group()
    x = torch.randn(3, requires_grad=True)
    first, second = run(fn, x, use_reentrant=False)
    with group():
        (a,) = torch.autograd.grad(first.sum(), x, retain_graph=True)
        (b,) = torch.autograd.grad(second.sum(), x)
    assert calls[0] == 2  # the forward and one recomputation
    assert torch.equal(a, x.detach().cos()) and torch.equal(b, -x.detach().sin())


@pytest.mark.skipif(
    not hasattr(torch_checkpoint, "create_selective_checkpoint_contexts"),
    reason=f"torch {torch.__version__} has no create_selective_checkpoint_contexts "
    "(absent from 2.4.1, present in 2.13)",
)
def test_selective_checkpoint_policy_as_context_fn() -> None:
    import functools

    policy = torch_checkpoint.create_selective_checkpoint_contexts([torch.ops.aten.mm.default])
    context_fn = functools.partial(lambda p: p, policy)
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8))
    x = torch.randn(4, 8, requires_grad=True)
    model(x).sum().backward()
    expected = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    model.zero_grad()
    x.grad = None
    checkpoint(model, x, use_reentrant=False, context_fn=context_fn).sum().backward()
    got = [p.grad for p in model.parameters()] + [x.grad]
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


# Bug 4: the generators of the devices the inputs live on ------------------------------------


class _OnDevice1(torch.Tensor):
    """Reports ``cpu:1`` as its device: an input on a second device of the backend."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cpu", 1)


class _TwoDevices(CpuBackend):
    """A host backend with two devices; device 1 has a generator of its own."""

    name = "two_devices"

    def __init__(self) -> None:
        self.second = torch.Generator().manual_seed(1)

    def device_count(self) -> int:
        return 2

    def get_rng_state(self, index: int | None = None) -> torch.Tensor:
        return self.second.get_state() if index == 1 else torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor, index: int | None = None) -> None:
        if index == 1:
            self.second.set_state(state)
        else:
            torch.set_rng_state(state)

    def fork_rng(self, enabled: bool = True, devices: Any = None) -> Any:
        from backends._common import forked_rng

        return forked_rng(enabled, self.get_rng_state, self.set_rng_state, devices)


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_generator_of_the_inputs_device_is_captured_and_replayed(reentrant: bool) -> None:
    backend = RecordingBackend(_TwoDevices())
    x = torch.randn(3).as_subclass(_OnDevice1).requires_grad_()
    # determinism_check="none": the recomputed tensors are plain cpu tensors.
    extra = {} if reentrant else {"determinism_check": "none"}
    out = checkpoint(torch.sin, x, use_reentrant=reentrant, backend=backend, **extra)
    forward = [(c.name, c.args) for c in backend.calls if "rng" in c.name]
    assert [(name, args[-1:]) for name, args in forward] == [("get_rng_state", (1,))]
    backend.clear()
    out.sum().backward()
    names = [c.name for c in backend.calls]
    assert "fork_rng" in names
    fork = next(c for c in backend.calls if c.name == "fork_rng")
    assert dict(fork.kwargs) == {"devices": [1]}
    restored = [c.args for c in backend.calls if c.name == "set_rng_state"]
    assert [args[1:] for args in restored] == [(1,)]


# Libraries that rebind torch's name to ours ----------------------------------------------


@pytest.mark.parametrize("reentrant", [None, True, False], ids=["default", "reentrant", "non"])
def test_torch_checkpoint_rebound_to_ours_does_not_recurse(
    monkeypatch: pytest.MonkeyPatch, reentrant: bool | None
) -> None:
    monkeypatch.setattr(torch_checkpoint, "checkpoint", checkpoint)
    monkeypatch.setattr(torch_checkpoint, "checkpoint_sequential", checkpoint_sequential)
    x = torch.randn(3, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch_checkpoint.checkpoint(torch.sin, x, use_reentrant=reentrant).sum().backward()
        torch_checkpoint.checkpoint_sequential([torch.sin], 1, x, use_reentrant=reentrant)
    assert torch.equal(x.grad, x.detach().cos())


# torch 2.15's additions: the decorator form and respect_saved_tensors_hooks ---------------


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_decorator_form(reentrant: bool) -> None:
    calls = [0]

    @checkpoint(use_reentrant=reentrant, backend="cpu")
    def block(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        calls[0] += 1
        return (x.sin() * scale).exp()

    x = torch.randn(3, requires_grad=True)
    block(x).sum().backward()
    assert calls[0] == 2 and block.__name__ == "block"
    expected = (x.detach().sin()).exp() * x.detach().cos()
    assert torch.allclose(x.grad, expected)
    with pytest.raises(ValueError, match=r"^Unexpected keyword arguments: scale$"):
        checkpoint(use_reentrant=False, scale=2.0)


def test_respect_saved_tensors_hooks_follows_the_installed_torch() -> None:
    x = torch.randn(3, requires_grad=True)
    if _compat.CHECKPOINT_TAKES_RESPECT_HOOKS:
        for value in (True, False):
            checkpoint(
                torch.sin, x, use_reentrant=False, respect_saved_tensors_hooks=value
            ).sum().backward()
        assert torch.equal(x.grad, 2 * x.detach().cos())
    else:
        checkpoint(torch.sin, x, use_reentrant=False, respect_saved_tensors_hooks=False)
        with pytest.raises(ValueError, match=r"^checkpointing: respect_saved_tensors_hooks=True"):
            checkpoint(torch.sin, x, use_reentrant=False, respect_saved_tensors_hooks=True)
