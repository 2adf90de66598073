"""Every error and warning, by message; the caller's state after a failure."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from accel import Accelerator
from checkpointing import (
    CheckpointError,
    checkpoint,
    checkpoint_sequential,
    checkpoint_wrapper,
    is_recomputing,
)

# Backend-generic tests put tensors on the backend's device.
pytestmark = pytest.mark.accel_requires("tensors")

MODES = [pytest.param(True, id="reentrant"), pytest.param(False, id="non_reentrant")]
GRAD_ERROR = (
    "When use_reentrant=True, torch.utils.checkpoint is incompatible with .grad() or passing "
    "an `inputs` parameter to .backward(). To resolve this error, you can either set "
    "use_reentrant=False, or call .backward() without passing the `inputs` argument."
)


class _Boom(Exception):
    pass


# Torch's errors, with torch's wording -----------------------------------------------------


def test_reentrant_with_autograd_grad() -> None:
    x = torch.randn(3, requires_grad=True)
    out = checkpoint(torch.sin, x, use_reentrant=True)
    with pytest.raises(RuntimeError) as info:
        torch.autograd.grad(out.sum(), x)
    assert str(info.value) == GRAD_ERROR


def test_reentrant_with_backward_inputs() -> None:
    x = torch.randn(3, requires_grad=True)
    out = checkpoint(torch.sin, x, use_reentrant=True)
    with pytest.raises(RuntimeError, match=r"incompatible with \.grad\(\) or passing an `inputs`"):
        out.sum().backward(inputs=[x])


def test_torch_error_wording_is_kept() -> None:
    # The same situation with torch's own checkpoint gives the same text.
    x = torch.randn(3, requires_grad=True)
    out = torch.utils.checkpoint.checkpoint(torch.sin, x, use_reentrant=True)
    with pytest.raises(RuntimeError) as info:
        torch.autograd.grad(out.sum(), x)
    assert str(info.value) == GRAD_ERROR


def test_reentrant_no_output_requires_grad() -> None:
    x = torch.randn(3, requires_grad=True)
    y = torch.randn(3)
    out = checkpoint(lambda a, b: b * 2, x, y, use_reentrant=True)
    assert out.requires_grad  # the Function marks it; recomputation shows otherwise
    with pytest.raises(
        RuntimeError,
        match=r"^none of output has requires_grad=True, this checkpoint\(\) is not necessary$",
    ):
        out.sum().backward()


def test_reentrant_unexpected_keyword_arguments() -> None:
    with pytest.raises(ValueError, match=r"^Unexpected keyword arguments: scale,shift$"):
        checkpoint(torch.mul, torch.ones(2), use_reentrant=True, scale=2.0, shift=1)


def test_reentrant_is_the_default_and_none_means_reentrant() -> None:
    for kwargs in ({}, {"use_reentrant": None}):
        with (
            pytest.warns(UserWarning, match="use_reentrant parameter should be passed explicitly"),
            pytest.raises(ValueError, match="Unexpected keyword arguments: scale"),
        ):
            checkpoint(torch.mul, torch.ones(2), scale=2.0, **kwargs)


@pytest.mark.parametrize(
    "option", [{"context_fn": lambda: (None, None)}, {"debug": True}], ids=["context_fn", "debug"]
)
def test_reentrant_rejects_non_reentrant_options(option: dict[str, object]) -> None:
    x = torch.ones(2, requires_grad=True)
    with pytest.raises(ValueError) as theirs:
        torch.utils.checkpoint.checkpoint(torch.sin, x, use_reentrant=True, **option)
    with pytest.raises(ValueError, match=r"^Passing `context_fn`.* is only supported when") as ours:
        checkpoint(torch.sin, x, use_reentrant=True, **option)
    assert str(ours.value) == str(theirs.value)  # the installed torch's wording


def test_reentrant_accepts_torch_default_context_fn() -> None:
    x = torch.ones(2, requires_grad=True)
    out = checkpoint(
        torch.sin, x, use_reentrant=True, context_fn=torch.utils.checkpoint.noop_context_fn
    )
    out.sum().backward()
    assert torch.equal(x.grad, torch.cos(x.detach()))


def test_unknown_determinism_check() -> None:
    with pytest.raises(
        ValueError, match=r"determinism_check should be one of \['default', 'none'\]"
    ):
        checkpoint(torch.sin, torch.ones(2), use_reentrant=False, determinism_check="strict")


def test_reentrant_warns_when_no_input_requires_grad() -> None:
    linear = nn.Linear(3, 3)
    with pytest.warns(
        UserWarning, match=r"^None of the inputs have requires_grad=True\. Gradients will be None$"
    ) as record:
        out = checkpoint(linear, torch.ones(2, 3), use_reentrant=True)
    assert record[0].filename == __file__  # points at the caller
    assert not out.requires_grad  # as torch: the parameters get no gradient


def test_non_reentrant_does_not_warn_without_grad_inputs() -> None:
    # pytest's filterwarnings=error turns any warning into a failure here.
    out = checkpoint(nn.Linear(3, 3), torch.ones(2, 3), use_reentrant=False)
    assert out.requires_grad


def test_checkpoint_sequential_unexpected_keyword_arguments() -> None:
    with pytest.raises(ValueError, match=r"^Unexpected keyword arguments: context_fn$"):
        checkpoint_sequential([torch.sin], 1, torch.ones(2), use_reentrant=True, context_fn=None)


@pytest.mark.parametrize("segments", [0, 4, 1.5])
def test_checkpoint_sequential_bad_segments(segments: object) -> None:
    with pytest.raises(ValueError, match=r"^checkpointing: segments must be"):
        checkpoint_sequential(
            [torch.sin, torch.cos, torch.tanh], segments, torch.ones(2), use_reentrant=True
        )  # type: ignore[arg-type]


def test_wrapping_twice_is_refused() -> None:
    wrapper = checkpoint_wrapper(nn.Linear(2, 2))
    with pytest.raises(
        ValueError, match=r"^checkpointing: this module is already a CheckpointWrapper"
    ):
        checkpoint_wrapper(wrapper)


# Non-reentrant recomputation mismatches ---------------------------------------------------


def test_determinism_check_none_skips_the_check() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        y = x.exp()
        if is_recomputing():
            y.exp()  # an extra saved tensor, unused
        return y

    x = torch.randn(3, requires_grad=True)
    checkpoint(fn, x, use_reentrant=False, determinism_check="none").sum().backward()
    assert torch.equal(x.grad, x.detach().exp())


def test_randomness_without_rng_replay_is_detected() -> None:
    # Dropout with a different mask still saves the same shapes: no error, different
    # gradient. A data-dependent shape is caught.
    def fn(x: torch.Tensor) -> torch.Tensor:
        keep = torch.rand(x.shape) > 0.5
        return x[keep].exp().sum()

    torch.manual_seed(0)
    x = torch.randn(4096, requires_grad=True)
    out = checkpoint(fn, x, use_reentrant=False, preserve_rng_state=False)
    with pytest.raises(CheckpointError, match="shape"):
        out.backward()


# The caller's state after an exception -----------------------------------------------------


def _states(backend: Accelerator) -> tuple[torch.Tensor, torch.Tensor, dict[str, object]]:
    return torch.get_rng_state(), backend.get_rng_state(), backend.autocast_kwargs()


def _assert_states(
    backend: Accelerator, before: tuple[torch.Tensor, torch.Tensor, dict[str, object]]
) -> None:
    cpu, device, autocast = _states(backend)
    assert torch.equal(cpu, before[0]), "the host generator changed"
    assert torch.equal(device, before[1]), "the device generator changed"
    assert autocast == before[2], "the autocast state changed"
    assert not is_recomputing()


@pytest.mark.parametrize("reentrant", MODES)
def test_exception_in_forward_leaves_caller_state(
    accel_backend: Accelerator, reentrant: bool
) -> None:
    device = accel_backend.device()

    def fn(x: torch.Tensor) -> torch.Tensor:
        nn.functional.dropout(x, 0.5)
        with torch.autocast(accel_backend.device_type, dtype=torch.bfloat16):
            raise _Boom

    x = torch.randn(4, 4, device=device, requires_grad=True)
    before = _states(accel_backend)
    with pytest.raises(_Boom):
        checkpoint(fn, x, use_reentrant=reentrant, backend=accel_backend)
    _assert_states(accel_backend, before)


class _FailsOnRecompute(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.dropout(self.bn(self.fc(x)), 0.5)
        if is_recomputing():
            raise _Boom
        return h


@pytest.mark.parametrize("reentrant", MODES)
def test_exception_in_recomputation_leaves_caller_state(
    accel_backend: Accelerator, reentrant: bool
) -> None:
    device = accel_backend.device()
    model = _FailsOnRecompute().to(device)
    x = torch.randn(8, 4, device=device, requires_grad=True)
    with torch.autocast(accel_backend.device_type, dtype=torch.bfloat16):
        # early_stop=False: the failure comes after the last saved tensor.
        out = checkpoint(model, x, use_reentrant=reentrant, backend=accel_backend, early_stop=False)
    params = [p.detach().clone() for p in model.parameters()]
    buffers = {name: (b, b.clone()) for name, b in model.named_buffers()}
    torch.manual_seed(99)
    before = _states(accel_backend)

    with pytest.raises(_Boom):
        out.float().sum().backward()

    _assert_states(accel_backend, before)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), params, strict=True))
    for name, (buffer, value) in buffers.items():
        current = dict(model.named_buffers())[name]
        assert current is buffer and torch.equal(current, value), name
    assert all(p.grad is None for p in model.parameters())


def test_a_function_that_is_not_callable_is_named() -> None:
    x = torch.randn(3, requires_grad=True)
    state = torch.get_rng_state()
    with pytest.raises(TypeError, match=r"^checkpointing: checkpoint\(\) runs a function, .* int"):
        checkpoint(3, x, use_reentrant=False)  # type: ignore[arg-type]
    assert torch.equal(torch.get_rng_state(), state) and x.grad is None
