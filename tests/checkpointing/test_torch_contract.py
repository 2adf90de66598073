"""torch's checkpoint contract, item by item: ours behaves as torch.utils.checkpoint does.

Where torch defines the behaviour (error texts, early stop, debug traces, warnings,
GraphExecGroup, vmap), each test runs the same scenario through torch's checkpoint and
through ours and compares, so it holds on every supported torch release.
"""

from __future__ import annotations

import re
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
from checkpointing import (
    CheckpointError,
    checkpoint,
    checkpoint_sequential,
    checkpoint_wrapper,
    set_checkpoint_debug_enabled,
    set_checkpoint_early_stop,
)

CHECKPOINTS = [
    pytest.param(torch_checkpoint.checkpoint, id="torch"),
    pytest.param(checkpoint, id="accel"),
]


def _error(run: Callable[[], Any]) -> BaseException:
    with pytest.raises(BaseException) as info:
        run()
    return info.value


def _both_errors(scenario: Callable[[Callable[..., Any]], Any]) -> tuple[str, str]:
    theirs = _error(lambda: scenario(torch_checkpoint.checkpoint))
    ours = _error(lambda: scenario(checkpoint))
    assert type(ours) is type(theirs)
    return _without_stacks(str(theirs)), _without_stacks(str(ours))


def _without_stacks(message: str) -> str:
    """Drop the Python/C++ stack frames of a debug trace: ours has a few more frames."""
    if "Operations executed" not in message and "operator" not in message.lower():
        return message
    return "\n".join(
        line
        for line in message.splitlines()
        if not re.search(r"[/\\]|0x|:\d+:|^\s*(File |\?\?|\(no)", line)
    )


# Bug 1: torch.autograd.grad inside the checkpointed function -------------------------------


def _gradient_penalty(x: torch.Tensor) -> torch.Tensor:
    (g,) = torch.autograd.grad((x * x).sin().sum(), x, create_graph=True)
    return g * x


@pytest.mark.parametrize("early_stop", [True, False])
def test_grad_inside_forward_gives_the_plain_gradients(early_stop: bool) -> None:
    x = torch.randn(6, requires_grad=True)
    _gradient_penalty(x).sum().backward()
    expected = x.grad
    x.grad = None
    checkpoint(_gradient_penalty, x, use_reentrant=False, early_stop=early_stop).sum().backward()
    assert torch.equal(x.grad, expected)


# Errors: torch's type and text, word for word ----------------------------------------------


def _changing(kind: str) -> Callable[[torch.Tensor], torch.Tensor]:
    calls = [0]

    def fn(x: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        again = calls[0] > 1
        if kind == "more":
            y = x.exp()
            return y.exp() if again else y
        if kind == "fewer":
            return x * 2 if again else x.exp().exp()
        if kind == "shape":
            return (x[:2] if again else x).exp().sum()
        return (x.double() if again else x).exp().sum()

    return fn


_DEBUG_LEAKS = pytest.mark.skipif(
    _compat.checkpoint_debug_leaks_on_error(),
    reason=f"torch {torch.__version__}'s own debug=True checkpoint leaves its operator logging "
    "installed after an error, which breaks every later test in the process (fixed by 2.13)",
)


@pytest.mark.parametrize("early_stop", [True, False], ids=["early_stop", "no_early_stop"])
@pytest.mark.parametrize("kind", ["more", "fewer", "shape", "dtype"])
@pytest.mark.parametrize(
    "debug", [False, pytest.param(True, marks=_DEBUG_LEAKS)], ids=["plain", "debug"]
)
def test_mismatch_errors_are_torchs(kind: str, early_stop: bool, debug: bool) -> None:
    def scenario(run: Callable[..., Any]) -> None:
        x = torch.randn(3, requires_grad=True)
        with set_checkpoint_early_stop(early_stop):  # read when the forward runs
            out = run(_changing(kind), x, use_reentrant=False, debug=debug)
        out.sum().backward()

    def run_scenario() -> tuple[str, str] | None:
        try:
            return _both_errors(scenario)
        except pytest.fail.Exception:
            return None  # neither raised: compared below

    found = run_scenario()
    if found is None:
        # torch raises nothing for this case (e.g. an extra tensor after early stop): nor do we.
        for run in (torch_checkpoint.checkpoint, checkpoint):
            scenario(run)
        return
    theirs, ours = found
    assert ours == theirs


def test_mismatch_error_is_checkpointing_checkpoint_error() -> None:
    out = checkpoint(_changing("shape"), torch.randn(3, requires_grad=True), use_reentrant=False)
    with pytest.raises(CheckpointError) as info:
        out.backward()
    assert isinstance(info.value, torch_checkpoint.CheckpointError)
    assert isinstance(info.value, RuntimeError)


@_DEBUG_LEAKS
def test_set_checkpoint_debug_enabled_gives_torchs_traces() -> None:
    def scenario(run: Callable[..., Any]) -> None:
        with set_checkpoint_early_stop(False):
            out = run(_changing("more"), torch.randn(3, requires_grad=True), use_reentrant=False)
        out.sum().backward()

    with set_checkpoint_debug_enabled(True):
        theirs, ours = _both_errors(scenario)
    assert ours == theirs
    assert "exp" in ours  # the recorded operator trace is part of the message


class _ReadsSavedTwice(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        (x,) = ctx.saved_tensors
        return grad * x.cos()


def test_saved_tensor_unpacked_twice_is_torchs_error() -> None:
    def scenario(run: Callable[..., Any]) -> None:
        x = torch.randn(3, requires_grad=True)
        run(_ReadsSavedTwice.apply, x.exp(), use_reentrant=False).sum().backward()

    theirs, ours = _both_errors(scenario)
    assert ours == theirs and "already unpacked once" in ours


def test_unknown_determinism_check_is_torchs_error() -> None:
    def scenario(run: Callable[..., Any]) -> None:
        run(torch.sin, torch.ones(2), use_reentrant=False, determinism_check="strict")

    theirs, ours = _both_errors(scenario)
    assert ours == theirs


# Early stop ----------------------------------------------------------------------------------


def _staged(stages: list[str]) -> Callable[[torch.Tensor], torch.Tensor]:
    def fn(x: torch.Tensor) -> torch.Tensor:
        stages.append("start")
        y = x.sin()  # the one saved tensor
        stages.append("after the last saved tensor")
        return y + 1

    return fn


@pytest.mark.parametrize("run", CHECKPOINTS)
@pytest.mark.parametrize(
    ("early_stop", "expected"),
    [(True, ["start"]), (False, ["start", "after the last saved tensor"])],
    ids=["early_stop", "no_early_stop"],
)
def test_early_stop_stops_the_recomputation(
    run: Callable[..., Any], early_stop: bool, expected: list[str]
) -> None:
    stages: list[str] = []
    x = torch.randn(3, requires_grad=True)
    if run is torch_checkpoint.checkpoint:  # torch 2.4 has only the global switch
        with set_checkpoint_early_stop(early_stop):
            out = run(_staged(stages), x, use_reentrant=False)
    else:
        out = run(_staged(stages), x, use_reentrant=False, early_stop=early_stop)
    stages.clear()
    out.sum().backward()
    assert stages == expected
    assert torch.equal(x.grad, x.detach().cos())


def test_global_early_stop_switch_applies_to_ours() -> None:
    stages: list[str] = []
    with set_checkpoint_early_stop(False):
        out = checkpoint(_staged(stages), torch.randn(3, requires_grad=True), use_reentrant=False)
    stages.clear()
    out.sum().backward()
    assert stages == ["start", "after the last saved tensor"]


# The use_reentrant warning ---------------------------------------------------------------


def _warnings(run: Callable[[], Any]) -> list[tuple[type[Warning], str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [(w.category, str(w.message)) for w in caught if "use_reentrant" in str(w.message)]


def test_missing_use_reentrant_warns_as_the_installed_torch() -> None:
    x = torch.randn(3, requires_grad=True)
    theirs = _warnings(lambda: torch_checkpoint.checkpoint(torch.sin, x))
    ours = _warnings(lambda: checkpoint(torch.sin, x))
    assert ours == theirs and len(ours) == 1


def test_missing_use_reentrant_warns_in_checkpoint_sequential_as_torch() -> None:
    x = torch.randn(3, requires_grad=True)
    layers = [nn.Linear(3, 3), nn.Linear(3, 3)]
    theirs = _warnings(lambda: torch_checkpoint.checkpoint_sequential(layers, 2, x))
    ours = _warnings(lambda: checkpoint_sequential(layers, 2, x))
    assert ours == theirs and len(ours) == 1


def test_explicit_use_reentrant_does_not_warn() -> None:
    x = torch.randn(3, requires_grad=True)
    assert _warnings(lambda: checkpoint(torch.sin, x, use_reentrant=True)) == []
    assert _warnings(lambda: checkpoint(torch.sin, x, use_reentrant=False)) == []


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


# Bug 3: torch.func.vmap --------------------------------------------------------------------


@pytest.mark.skipif(
    not _compat.checkpoint_supports_vmap(),
    reason=f"torch {torch.__version__}'s own non-reentrant checkpoint does not support vmap "
    "(_NoopSaveInputs has no vmap rule; fixed by pytorch#174327, present in 2.13)",
)
def test_vmap_over_the_non_reentrant_checkpoint() -> None:
    torch.manual_seed(0)
    weight = torch.randn(4, 4)

    def fn(v: torch.Tensor) -> torch.Tensor:
        return torch.tanh(v @ weight).sum()

    xs = torch.randn(5, 4, requires_grad=True)
    got = torch.func.vmap(lambda v: checkpoint(fn, v, use_reentrant=False))(xs)
    assert torch.equal(got, torch.func.vmap(fn)(xs))

    # Back-propagating through the vmapped checkpoint behaves as torch's own does.
    def scenario(run: Callable[..., Any]) -> None:
        out = torch.func.vmap(lambda v: run(fn, v, use_reentrant=False))(xs)
        torch.autograd.grad(out.square().sum(), xs)

    try:
        theirs, ours = _both_errors(scenario)
    except pytest.fail.Exception:  # a torch where it works: the gradients must agree
        expected = torch.autograd.grad(torch.func.vmap(fn)(xs).square().sum(), xs)
        got_grad = torch.autograd.grad(
            torch.func.vmap(lambda v: checkpoint(fn, v, use_reentrant=False))(xs).square().sum(),
            xs,
        )
        assert torch.equal(got_grad[0], expected[0])
    else:
        assert ours == theirs


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
