"""On/off environment variables accept the usual spellings and reject the rest."""

from __future__ import annotations

import pytest

import accel
from accel import _env


@pytest.mark.parametrize("value", ["1", "true", "TRUE", " Yes ", "on", "On"])
def test_true_spellings(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("ACCEL_STRICT_PLUGINS", value)
    assert _env.flag("ACCEL_STRICT_PLUGINS") is True


@pytest.mark.parametrize("value", ["", " ", "0", "false", "False", "no", "NO", "off"])
def test_false_spellings(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("ACCEL_STRICT_PLUGINS", value)
    assert _env.flag("ACCEL_STRICT_PLUGINS") is False


def test_unset_is_off() -> None:
    assert _env.flag("ACCEL_STRICT_PLUGINS") is False


@pytest.mark.parametrize("variable", ["ACCEL_STRICT_PLUGINS", "ACCEL_DISABLE_PLUGIN_AUTOLOAD"])
@pytest.mark.parametrize("value", ["maybe", "2", "enable"])
def test_other_values_are_rejected_by_get_backend(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(accel.ConfigurationError) as info:
        accel.get_backend()
    message = str(info.value)
    assert message.startswith(f"The environment variable {variable} is {value!r}, which is not")
    assert "1, true, yes or on" in message and "0, false, no or off" in message
    assert isinstance(info.value, ValueError)
