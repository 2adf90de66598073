"""Which Accelerator calls checkpointing makes, and in which order.

With :class:`RecordingBackend` the order of protocol calls is observable; with the
``habana_frameworks`` double the calls reach Gaudi's own API (``mark_step`` in lazy
mode, the generator of device 0).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn

import accel
from accel.testing import Call, RecordingBackend
from checkpointing import checkpoint, checkpoint_sequential, checkpoint_wrapper, is_recomputing

MODES = [pytest.param(True, id="reentrant"), pytest.param(False, id="non_reentrant")]
RNG_CALLS = ("get_rng_state", "set_rng_state", "fork_rng")


def _marked_function(backend: RecordingBackend) -> Any:
    """Dropout whose recomputation appends a ``recompute`` marker to the recorded calls."""
    weight = torch.linspace(-1.0, 1.0, 8, requires_grad=True)

    def fn(x: torch.Tensor) -> torch.Tensor:
        if is_recomputing():
            backend.calls.append(Call("recompute"))
        return nn.functional.dropout(x * weight, p=0.5)

    return fn


def _input(backend: RecordingBackend) -> torch.Tensor:
    x = torch.randn(4, 8, requires_grad=True)
    x.register_hook(lambda grad: backend.calls.append(Call("input_grad")) or None)
    return x


@pytest.mark.parametrize("reentrant", MODES)
def test_backward_order(reentrant: bool) -> None:
    backend = RecordingBackend()
    out = checkpoint(
        _marked_function(backend), _input(backend), use_reentrant=reentrant, backend=backend
    )
    forward_calls = backend.call_names()
    assert "get_rng_state" in forward_calls and "autocast_kwargs" in forward_calls
    for name in ("mark_step", "fork_rng", "set_rng_state", "recompute"):
        assert name not in forward_calls, f"{name} was called in forward: {forward_calls}"
    backend.clear()

    out.sum().backward()

    backend.assert_order("mark_step", "fork_rng", "set_rng_state", "recompute", "input_grad")
    names = backend.call_names()
    assert names.count("mark_step") == 1 and names.count("recompute") == 1


@pytest.mark.parametrize("reentrant", MODES)
def test_no_rng_calls_without_preserve_rng_state(reentrant: bool) -> None:
    backend = RecordingBackend()
    out = checkpoint(
        _marked_function(backend),
        _input(backend),
        use_reentrant=reentrant,
        preserve_rng_state=False,
        backend=backend,
    )
    out.sum().backward()

    backend.assert_not_called(*RNG_CALLS)
    backend.assert_order("mark_step", "recompute", "input_grad")


@pytest.mark.parametrize("reentrant", MODES)
def test_restored_state_is_the_forward_state(reentrant: bool) -> None:
    backend = RecordingBackend()
    fn, x = _marked_function(backend), _input(backend)
    torch.manual_seed(5)
    forward_state = torch.get_rng_state()
    out = checkpoint(fn, x, use_reentrant=reentrant, backend=backend)
    torch.manual_seed(6)  # the caller's generator moves on before backward
    before_backward = torch.get_rng_state()
    backend.clear()
    out.sum().backward()

    set_calls = [call for call in backend.calls if call.name == "set_rng_state"]
    assert len(set_calls) == 1, backend.call_names()
    (state,) = set_calls[0].args
    assert torch.equal(state, forward_state)
    assert torch.equal(torch.get_rng_state(), before_backward)


def test_no_protocol_calls_inside_no_grad() -> None:
    backend = RecordingBackend()
    with torch.no_grad():
        checkpoint(
            _marked_function(backend), torch.randn(4, 8), use_reentrant=True, backend=backend
        )
        checkpoint(
            _marked_function(backend), torch.randn(4, 8), use_reentrant=False, backend=backend
        )
    assert backend.call_names() == []


def test_backend_defaults_to_get_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEL", "recording")
    backend = accel.get_backend()
    assert isinstance(backend, RecordingBackend)
    out = checkpoint(_marked_function(backend), _input(backend), use_reentrant=False)
    out.sum().backward()
    backend.assert_order("get_rng_state", "mark_step", "set_rng_state", "recompute")


@pytest.mark.parametrize("reentrant", MODES)
def test_sequential_and_wrapper_use_the_given_backend(reentrant: bool) -> None:
    backend = RecordingBackend()
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Linear(4, 4), nn.Linear(4, 4))
    x = torch.randn(2, 4, requires_grad=True)
    checkpoint_sequential(model, 3, x, use_reentrant=reentrant, backend=backend).sum().backward()
    assert backend.count("mark_step") == 2  # two checkpointed segments, the last one plain
    backend.clear()
    wrapper = checkpoint_wrapper(model, use_reentrant=reentrant, backend=backend)
    wrapper(x).sum().backward()
    backend.assert_order("get_rng_state", "mark_step", "fork_rng", "set_rng_state")
    assert backend.count("mark_step") == 1


@pytest.mark.parametrize("reentrant", MODES)
def test_nested_checkpoints_flush_before_each_recomputation(reentrant: bool) -> None:
    backend = RecordingBackend()
    inner = nn.Linear(4, 4)

    def outer(x: torch.Tensor) -> torch.Tensor:
        return checkpoint(inner, x.sin(), use_reentrant=reentrant, backend=backend).cos()

    x = torch.randn(3, 4, requires_grad=True)
    checkpoint(outer, x, use_reentrant=reentrant, backend=backend).sum().backward()
    # The outer region is recomputed once, the inner one once for the outer's
    # recomputation's backward (reentrant) or once on its own (non-reentrant).
    assert backend.count("mark_step") == 2


# The Gaudi double ---------------------------------------------------------------------------


def _hpu(monkeypatch: pytest.MonkeyPatch, lazy: str) -> accel.Accelerator:
    monkeypatch.setenv("PT_HPU_LAZY_MODE", lazy)
    return accel.get_backend("hpu")


def _dropout(x: torch.Tensor) -> torch.Tensor:
    return nn.functional.dropout(x.exp(), p=0.5)


@pytest.mark.parametrize("reentrant", MODES)
def test_lazy_gaudi_flushes_and_restores_the_device_generator(
    habana_double: ModuleType, monkeypatch: pytest.MonkeyPatch, reentrant: bool
) -> None:
    backend = _hpu(monkeypatch, "1")
    assert backend.is_lazy
    x = torch.randn(6, 5, requires_grad=True)
    torch.manual_seed(3)
    expected_out = _dropout(x)
    expected_out.sum().backward()
    assert x.grad is not None
    expected_grad = x.grad.clone()
    x.grad = None

    torch.manual_seed(3)
    backend.manual_seed(11)
    forward_device_state = backend.get_rng_state()
    habana_double.CALLS.clear()
    out = checkpoint(_dropout, x, use_reentrant=reentrant, backend=backend)
    assert habana_double.call_args("hpu.random.get_rng_state") == [(0,)]
    assert habana_double.call_args("core.mark_step") == []
    backend.manual_seed(12)  # the device generator moves on before backward
    habana_double.CALLS.clear()
    out.sum().backward()

    assert habana_double.call_args("core.mark_step") == [("", False)]
    restores = habana_double.call_args("hpu.random.set_rng_state")
    assert restores, habana_double.call_names()
    state, device = restores[0]
    assert device == 0
    assert torch.equal(state, forward_device_state)
    names = habana_double.call_names()
    assert names.index("core.mark_step") < names.index("hpu.random.set_rng_state")
    assert torch.equal(out, expected_out)
    assert torch.equal(x.grad, expected_grad)


@pytest.mark.parametrize("reentrant", MODES)
def test_eager_gaudi_does_not_call_mark_step(
    habana_double: ModuleType, monkeypatch: pytest.MonkeyPatch, reentrant: bool
) -> None:
    backend = _hpu(monkeypatch, "0")
    assert not backend.is_lazy
    x = torch.randn(6, 5, requires_grad=True)
    checkpoint(_dropout, x, use_reentrant=reentrant, backend=backend).sum().backward()

    assert habana_double.call_args("core.mark_step") == []
    assert [device for _, device in habana_double.call_args("hpu.random.set_rng_state")][:1] == [0]
