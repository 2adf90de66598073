"""The recording backend on every supported Python."""

from __future__ import annotations

import inspect

import accel
from backends.recording import RecordingBackend


def test_recording_backend_is_an_accelerator_on_every_python() -> None:
    # isinstance looks protocol members up statically since Python 3.12: members served
    # only by __getattr__ would make it False there.
    backend = RecordingBackend()
    assert isinstance(backend, accel.Accelerator)
    for member in accel.protocol_members():
        inspect.getattr_static(backend, member)
    backend.mark_step()
    assert backend.call_names() == ["mark_step"]
