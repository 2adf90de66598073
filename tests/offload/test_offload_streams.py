"""Loads and stores on two copy streams, ordered by events, seen through vector clocks.

The host cannot show copies overlapping, so these tests run offload on
:class:`StreamedCpu` (``tests/offload/_streamed.py``): streams whose clocks say what
each operation was ordered after. No race (two streams touching the same memory, one
writing, unordered) may exist: a load is consumed only after its event, a store never
starts before the gradient it copies is produced, a buffer is refilled only after its
last reader. Removing one wait makes the detector fail, so it cannot pass by accident.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _offload_streamed import StreamedCpu, Timeline
from torch import nn

import accel
from offload import OffloadModel, offload_parameters
from offload._core.transfer import Transfers
from offload._params.swap import SwapData

pytestmark = pytest.mark.usefixtures("copies")


def make(kind: str = "batch-norm") -> nn.Sequential:
    """Running statistics stored in forward, or a weight tied across slices (and no buffers,
    so that forward never waits for the host: only events order the copies)."""
    torch.manual_seed(0)
    if kind == "batch-norm":
        return nn.Sequential(
            nn.Linear(8, 8),
            nn.ReLU(),
            nn.Linear(8, 8),
            nn.BatchNorm1d(8),
            nn.Linear(8, 8),
            nn.Tanh(),
        )
    layers = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(6)])
    layers[5][0].weight = layers[0][0].weight
    return layers


def batches() -> list[torch.Tensor]:
    return [torch.randn(4, 8, generator=torch.Generator().manual_seed(k)) for k in range(3)]


def train(model: nn.Module, timeline: Timeline | None = None) -> list[torch.Tensor]:
    """Three steps of SGD; the losses and the parameters after them."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x in batches():
        if timeline is None:
            loss = model(x).square().mean()
            loss.backward()
        else:
            with timeline:
                loss = model(x).square().mean()
                loss.backward()
        losses.append(loss.detach())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return [*losses, *(p.detach().clone() for p in model.parameters())]


def offloaded_model(backend: StreamedCpu, checkpoint_activation: bool, kind: str) -> nn.Module:
    return OffloadModel(
        make(kind), num_slices=3, backend=backend, checkpoint_activation=checkpoint_activation
    )


def parameter_offload(backend: StreamedCpu, checkpoint_activation: bool, kind: str) -> nn.Module:
    del checkpoint_activation
    model = make(kind)
    offload_parameters(model, prefetch=1, backend=backend)
    return model


WRAPPERS: dict[str, Callable[[StreamedCpu, bool, str], nn.Module]] = {
    "OffloadModel": offloaded_model,
    "offload_parameters": parameter_offload,
}


def transfers_of(model: nn.Module) -> Transfers:
    if isinstance(model, OffloadModel):
        return model._strategy.config.transfers
    from offload import ParameterOffload

    handle = ParameterOffload.of(model)
    assert handle is not None
    assert isinstance(handle.strategy, SwapData)
    return handle.strategy.transfers


@pytest.mark.parametrize("kind", ["batch-norm", "tied"])
@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
@pytest.mark.parametrize("checkpoint_activation", [False, True], ids=["plain", "ckpt"])
def test_two_copy_streams_without_a_race_and_bit_exact(
    wrapper: str, checkpoint_activation: bool, kind: str
) -> None:
    expected = train(make(kind))
    timeline = Timeline()
    backend = StreamedCpu(timeline, copy_engines=2)
    assert accel.copy_engines(backend) == 2
    model = WRAPPERS[wrapper](backend, checkpoint_activation, kind)
    got = train(model, timeline)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    transfers = transfers_of(model)
    load, store = transfers.stream, transfers.store_stream
    assert len({id(load), id(store), id(timeline.compute)}) == 3
    assert timeline.copies_on(load) > 0, "no load was issued on the load stream"
    assert timeline.copies_on(store) > 0, "no gradient was stored on the store stream"
    races = timeline.races()
    assert not races, races[:3]


@pytest.mark.parametrize("engines", [1, 0])
def test_one_copy_engine_keeps_one_copy_stream(engines: int) -> None:
    expected = train(make())
    timeline = Timeline()
    backend = StreamedCpu(timeline, copy_engines=engines)
    model = offloaded_model(backend, True, "batch-norm")
    got = train(model, timeline)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    transfers = transfers_of(model)
    assert transfers.store_stream is transfers.stream and len(backend.streams) == 1
    assert timeline.copies_on(transfers.stream) > 0
    assert not timeline.races()


def _skip_store_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stores no longer wait for compute: a gradient may be copied before it exists."""
    waits = Transfers.copy_waits

    def copy_waits(self: Transfers, event: Any, *, store: bool = False) -> None:
        if not store:
            waits(self, event)

    monkeypatch.setattr(Transfers, "copy_waits", copy_waits)
    monkeypatch.setattr(Transfers, "copy_waits_for_compute", lambda self, *, store=False: None)


def _skip_compute_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compute no longer waits for loads: a slice may be used before it arrived."""
    monkeypatch.setattr(Transfers, "compute_waits", lambda self, event: None)


@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
@pytest.mark.parametrize("broken", [_skip_store_waits, _skip_compute_waits], ids=["store", "load"])
def test_the_detector_sees_a_missing_wait(
    wrapper: str, broken: Callable[[pytest.MonkeyPatch], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    broken(monkeypatch)
    timeline = Timeline()
    model = WRAPPERS[wrapper](StreamedCpu(timeline, copy_engines=2), False, "tied")
    train(model, timeline)
    assert timeline.races(), "a wait was removed, yet no race was found"


def _wait_for_the_default_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """Copies wait for the default stream instead of the current one."""

    def compute_event(self: Transfers) -> Any:
        return self.backend.timeline.compute.record_event()

    def copy_waits_for_compute(self: Transfers, *, store: bool = False) -> None:
        self._of(store).wait_stream(self.backend.timeline.compute)

    monkeypatch.setattr(Transfers, "compute_event", compute_event)
    monkeypatch.setattr(Transfers, "copy_waits_for_compute", copy_waits_for_compute)


@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
@pytest.mark.parametrize("waits_for", ["current", "default"])
def test_stores_wait_for_the_stream_that_computed_the_gradients(
    wrapper: str, waits_for: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The whole step runs on a stream other than the default one. A store that waited for
    # the default stream (DeepSpeed ZeRO-3's race until its PR #7898) could copy a
    # gradient before backward wrote it; offload waits for the current stream.
    if waits_for == "default":
        _wait_for_the_default_stream(monkeypatch)
    expected = train(make("tied"))
    timeline = Timeline()
    backend = StreamedCpu(timeline, copy_engines=2)
    model = WRAPPERS[wrapper](backend, True, "tied")
    with backend.stream(backend.Stream()):
        got = train(model, timeline)
    races = timeline.races()
    if waits_for == "default":
        assert races, "copies waited for the default stream, yet no race was found"
    else:
        assert not races, races[:3]
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def test_parameter_offload_reuses_the_memory_of_dropped_units() -> None:
    # Six blocks of one shape: a unit loads into the memory its predecessor left, once
    # compute is done with it (the race detector checks that wait), not into new memory.
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(6)])
    expected = train(copy.deepcopy(model))
    timeline = Timeline()
    backend = StreamedCpu(timeline, copy_engines=2)
    offload_parameters(model, prefetch=1, backend=backend)
    got = train(model, timeline)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    load = transfers_of(model).stream
    allocations = [numel for stream, numel in timeline.allocations if stream == load.id]
    flats = [numel for numel in allocations if numel >= 8 * 8 + 8]
    # Without reuse: one flat per unit load, twice per step (forward and backward).
    assert 0 < len(flats) <= 3 * (1 + 2), flats
    assert not timeline.races()
