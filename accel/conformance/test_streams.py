"""Streams and events: real objects, correct ordering, or valid no-ops."""

from __future__ import annotations

import pytest
import torch

import accel
from accel import Accelerator, Event, Stream
from accel.conformance import rule


def test_objects(accel_backend: Accelerator) -> None:
    current = accel_backend.current_stream()
    assert current is not None and isinstance(current, Stream), rule(
        "streams", f"current_stream() returned {current!r}"
    )
    side = accel_backend.Stream()
    assert isinstance(side, Stream), rule("streams", f"Stream() returned {side!r}")
    event = accel_backend.Event()
    assert isinstance(event, Event), rule("streams", f"Event() returned {event!r}")
    with accel_backend.stream(side):
        event.record()
    side.wait_event(event)
    current.wait_stream(side)
    event.synchronize()
    side.synchronize()
    assert event.query() and side.query(), rule("streams", "work pending after synchronize()")


def test_copy_engines(accel_backend: Accelerator) -> None:
    engines = accel.copy_engines(accel_backend)
    assert isinstance(engines, int) and not isinstance(engines, bool) and engines >= 0, rule(
        "copy-engines", f"accel.copy_engines() gave {engines!r}, not an int >= 0"
    )
    own = getattr(accel_backend, "copy_engines", None)
    assert own is None or (isinstance(own, int) and not isinstance(own, bool) and own >= 0), rule(
        "copy-engines", f"the backend's copy_engines is {own!r}, not an int >= 0"
    )
    if not accel_backend.supports_streams:
        assert engines == 0, rule(
            "copy-engines", f"supports_streams is False, yet copy_engines is {engines}"
        )


def test_null_streams_complete_at_once(accel_backend: Accelerator) -> None:
    if accel_backend.supports_streams:
        pytest.skip("this backend has real streams; see test_stream_ordering.")
    stream = accel_backend.Stream()
    assert stream.query() and stream.record_event().query(), rule(
        "streams", "supports_streams is False, yet stream work is reported pending"
    )


@pytest.mark.accel_requires("tensors")
def test_stream_ordering(accel_backend: Accelerator) -> None:
    device = accel_backend.device()
    source = torch.arange(1 << 20, dtype=torch.float32, device=device)
    side = accel_backend.Stream()
    side.wait_stream(accel_backend.current_stream())
    with accel_backend.stream(side):
        produced = source * 2
        done = side.record_event()
    accel_backend.record_stream(source, side)
    accel_backend.current_stream().wait_event(done)
    total = float(produced.sum().cpu())
    expected = float((torch.arange(1 << 20, dtype=torch.float64) * 2).sum())
    assert total == pytest.approx(expected, rel=1e-6), rule(
        "stream-order", f"consumer saw sum {total}, expected {expected}"
    )
