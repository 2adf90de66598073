"""accel.resolve_backend: the one rule for every subsystem's ``backend=`` argument."""

from __future__ import annotations

from typing import Any

import pytest

import accel
from accel.testing import RecordingBackend


def test_none_a_name_and_a_backend() -> None:
    assert accel.resolve_backend(None, "demo") is accel.get_backend()
    assert accel.resolve_backend("cpu", "demo") is accel.get_backend("cpu")
    recording = RecordingBackend(accel.get_backend("cpu"))
    assert accel.resolve_backend(recording, "demo") is recording  # members via __getattr__


def test_an_unknown_name_keeps_its_class_and_names_the_subsystem() -> None:
    with pytest.raises(
        accel.BackendNotFoundError, match=r"^offload: backend='nope' cannot be used: "
    ) as info:
        accel.resolve_backend("nope", "offload")
    assert isinstance(info.value.__cause__, accel.BackendNotFoundError)


@pytest.mark.parametrize("bad", [3, ["cpu"], object()], ids=["int", "list", "object"])
def test_a_wrong_type_is_a_sentence_naming_the_fix(bad: Any) -> None:
    with pytest.raises(
        accel.AccelTypeError, match=r"^checkpointing: device_backend must be an accel backend"
    ) as info:
        accel.resolve_backend(bad, "checkpointing", where="device_backend")
    message = str(info.value)
    assert "lacks " in message and "python -m accel" in message and message.endswith(".")


def test_every_subsystem_answers_alike() -> None:
    from checkpointing._args import resolve_backend as checkpointing_backend
    from offload._core.transfer import resolve_backend as offload_backend

    assert offload_backend(None) is accel.get_backend()
    assert checkpointing_backend(None) is None  # chosen from the inputs when it runs
    for resolve, prefix in ((offload_backend, "offload"), (checkpointing_backend, "checkpointing")):
        assert resolve("cpu") is accel.get_backend("cpu")
        with pytest.raises(accel.AccelTypeError, match=f"^{prefix}: backend must be"):
            resolve(42)
        with pytest.raises(accel.BackendNotFoundError, match=f"^{prefix}: backend='nope'"):
            resolve("nope")
