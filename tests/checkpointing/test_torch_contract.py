"""torch's checkpoint contract, item by item: ours behaves as torch.utils.checkpoint does.

Where torch defines the behaviour (error texts, early stop, debug traces, warnings,
GraphExecGroup, vmap), each test runs the same scenario through torch's checkpoint and
through ours and compares, so it holds on every supported torch release.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.utils.checkpoint as torch_checkpoint
from torch import nn

from accel import _compat
from checkpointing import (
    CheckpointError,
    checkpoint,
    checkpoint_sequential,
    set_checkpoint_early_stop,
)

ROOT = Path(__file__).resolve().parents[2]

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
    reason=f"torch {torch.__version__}'s own debug=True checkpoint leaves its operator "
    "logging installed after an error, which breaks every later test in the process "
    "(2.13 and 2.15 clean up)",
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


_DEBUG_TRACE_SCRIPT = """
import torch, torch.utils.checkpoint as tc
from checkpointing import checkpoint, set_checkpoint_debug_enabled, set_checkpoint_early_stop

def changing():
    calls = [0]
    def fn(x):
        calls[0] += 1
        y = x.exp()
        return y.exp() if calls[0] > 1 else y
    return fn

def error(run):
    try:
        with set_checkpoint_early_stop(False):
            out = run(changing(), torch.randn(3, requires_grad=True), use_reentrant=False)
        out.sum().backward()
    except BaseException as caught:
        return caught
    raise SystemExit("no error")

with set_checkpoint_debug_enabled(True):
    theirs, ours = error(tc.checkpoint), error(checkpoint)
print(type(theirs).__name__, type(ours).__name__)
print(str(theirs).count("aten.exp"), str(ours).count("aten.exp"))
"""


@_DEBUG_LEAKS
def test_set_checkpoint_debug_enabled_gives_torchs_traces() -> None:
    # In a fresh process: torch's operator logging, which the trace is made of, depends on
    # process-wide logging state that earlier tests and pytest's own log capture change.
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-c", _DEBUG_TRACE_SCRIPT],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    types, counts = result.stdout.splitlines()[-2:]
    assert types == "CheckpointError CheckpointError"
    theirs, ours = (int(n) for n in counts.split())
    assert ours == theirs and ours >= 3  # the recorded operator trace is in both messages


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
