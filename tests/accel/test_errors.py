from __future__ import annotations

import pytest

import accel
from accel import (
    AccelError,
    BackendConflictError,
    BackendNotFoundError,
    BackendUnavailableError,
    DeviceIndexError,
    PluginError,
    PluginLoadError,
    ProtocolViolationError,
)


@pytest.mark.parametrize(
    ("error", "bases"),
    [
        (BackendNotFoundError, (AccelError, LookupError)),
        (BackendUnavailableError, (AccelError, RuntimeError)),
        (DeviceIndexError, (AccelError, ValueError)),
        (accel.DistributedSetupError, (AccelError, RuntimeError)),
        (PluginLoadError, (PluginError, AccelError)),
        (BackendConflictError, (PluginError, AccelError)),
        (ProtocolViolationError, (PluginError, AccelError, TypeError)),
    ],
)
def test_hierarchy(error: type[Exception], bases: tuple[type[Exception], ...]) -> None:
    assert issubclass(error, bases)


def test_hierarchy_is_drawn_in_the_module_docstring() -> None:
    from accel import _errors

    assert _errors.__doc__ is not None
    for name in _errors.__all__:
        assert name in _errors.__doc__


def test_unknown_accel_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEL", "bogus")
    with pytest.raises(BackendNotFoundError) as info:
        accel.get_backend()
    message = str(info.value)
    assert "ACCEL='bogus' is not a known backend" in message
    known = message.split("Known backends: ")[1].split(".")[0].split(", ")
    assert {"cpu", "cuda", "hpu", "mps", "recording", "xpu"} <= set(known)
    assert "python -m accel" in message


def test_unknown_explicit_name() -> None:
    with pytest.raises(BackendNotFoundError, match=r"get_backend\('nope'\) is not a known backend"):
        accel.get_backend("nope")


def test_cuda_without_gpu_says_no_device_is_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    if torch.cuda.device_count() > 0:
        pytest.skip("a CUDA device is visible here; this checks the message without one.")
    monkeypatch.setenv("ACCEL", "cuda")
    with pytest.raises(BackendUnavailableError) as info:
        accel.get_backend()
    message = str(info.value)
    assert message.startswith("ACCEL='cuda' is not usable here: no CUDA device is visible")
    assert "Available: cpu" in message


def test_device_index_error_message() -> None:
    with pytest.raises(DeviceIndexError) as info:
        accel.get_backend("cpu").device(3)
    assert "device index 3 is out of range" in str(info.value)
    assert "valid indices: 0..0" in str(info.value)


@pytest.mark.parametrize("index", ["0", 1.0, True])
def test_device_index_must_be_an_int(index: object) -> None:
    with pytest.raises(DeviceIndexError, match="a device index must be an int"):
        accel.get_backend("cpu").set_device(index)  # type: ignore[arg-type]


def test_backend_spec_validates_its_name() -> None:
    with pytest.raises(ValueError, match="Backend name 'My NPU' is invalid"):
        accel.BackendSpec(
            name="My NPU", factory=object, probe=lambda: accel.Availability(available=True)
        )  # type: ignore[arg-type]


def test_backend_spec_validates_callables() -> None:
    with pytest.raises(TypeError, match="probe must be callable"):
        accel.BackendSpec(name="npu", factory=object, probe=None)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", [123, ["cpu"], b"cpu", 1.5])
def test_backend_name_must_be_a_string(name: object) -> None:
    with pytest.raises(accel.AccelTypeError) as info:
        accel.get_backend(name)  # type: ignore[arg-type]
    message = str(info.value)
    assert message.startswith("A backend name must be a str such as 'cpu' or 'cuda'")
    assert f"got {type(name).__name__} {name!r}" in message
    assert isinstance(info.value, TypeError)
    with pytest.raises(accel.AccelTypeError):
        accel.select_backend(name)  # type: ignore[arg-type]
