from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import accel
from accel import (
    BackendConflictError,
    PluginLoadError,
    PluginLoadWarning,
    ProtocolViolationError,
)
from accel._discovery import discover

BROKEN_PLUGINS = {"fakebroken", "fakehookerror", "fakenohook"}


def _discover_with_warnings() -> tuple[list[str], list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        names = [info.name for info in accel.list_backends()]
    messages = [str(w.message) for w in caught if issubclass(w.category, PluginLoadWarning)]
    return names, messages


def test_working_plugin_is_found_with_its_distribution(plugin_site: Path) -> None:
    with pytest.warns(PluginLoadWarning):
        rows = {info.name: info for info in accel.list_backends()}
    row = rows["fakeok"]
    assert (row.provider, row.version, row.plugin) == ("accel-fake-plugins", "1.0", "fakeok")
    assert row.available and row.device_count == 1
    backend = accel.get_backend("fakeok")
    assert backend.name == "fakeok"
    assert accel.get_backend(" FakeOK ") is backend


def test_broken_plugins_are_named_and_the_rest_keep_working(plugin_site: Path) -> None:
    names, messages = _discover_with_warnings()
    assert {"cpu", "fakeok", "fakeincomplete", "fakenorestore"} <= set(names)
    assert len(messages) == 3
    joined = "\n".join(messages)
    for plugin in BROKEN_PLUGINS:
        assert f"entry point {plugin!r} of distribution accel-fake-plugins 1.0" in joined
    assert "ModuleNotFoundError" in joined
    assert "RuntimeError: fake hook failure" in joined
    assert "no function named accel_backends marked with @accel.hookimpl" in joined
    assert "ACCEL_DISABLED_PLUGINS=fakebroken" in joined
    failures = {failure.provider.plugin for failure in accel.plugin_failures()}
    assert failures == BROKEN_PLUGINS
    assert accel.get_backend().name == "cpu"


def test_strict_mode_raises_naming_the_plugin(
    plugin_site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCEL_STRICT_PLUGINS", "1")
    with pytest.raises(PluginLoadError, match=r"accel-fake-plugins 1\.0"):
        accel.get_backend("cpu")


def test_disabled_plugins_are_skipped_silently(
    plugin_site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCEL_DISABLED_PLUGINS", " fakebroken, fakehookerror,fakenohook ")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        names = [info.name for info in accel.list_backends()]
    assert "fakeok" in names


def test_autoload_can_be_disabled(plugin_site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEL_DISABLE_PLUGIN_AUTOLOAD", "1")
    names = {info.name for info in accel.list_backends()}
    assert names == {"cpu", "cuda", "hpu", "mps", "recording", "xpu"}


def test_protocol_violation_names_missing_members(plugin_site: Path) -> None:
    with pytest.warns(PluginLoadWarning), pytest.raises(ProtocolViolationError) as info:
        accel.get_backend("fakeincomplete")
    message = str(info.value)
    assert "Backend 'fakeincomplete' from entry point 'fakeincomplete'" in message
    assert "accel-fake-plugins 1.0" in message
    assert "lacks " in message and "fork_rng" in message and "device_count" in message
    assert "mark_step," not in message


def test_two_providers_of_one_name_is_an_error_naming_both(conflict_site: Path) -> None:
    with pytest.warns(PluginLoadWarning), pytest.raises(BackendConflictError) as info:
        accel.get_backend("fakeok")
    message = str(info.value)
    assert "accel-fake-plugins 1.0" in message and "accel-fake-dupe 2.0" in message
    assert "setting ACCEL_DISABLED_PLUGINS to one of: fakedupe, fakeok." in message
    assert accel.get_backend("cpu").name == "cpu"


def test_conflict_is_listed_as_unavailable(conflict_site: Path) -> None:
    with pytest.warns(PluginLoadWarning):
        rows = [info for info in accel.list_backends() if info.name == "fakeok"]
    assert {row.provider for row in rows} == {"accel-fake-plugins", "accel-fake-dupe"}
    assert all(not row.available and "provided twice" in (row.reason or "") for row in rows)


def test_discovery_does_not_create_backends(plugin_site: Path) -> None:
    with pytest.warns(PluginLoadWarning):
        catalog = discover()
    assert "fakeincomplete" in catalog.entries


def test_plugins_load_lazily_not_at_import() -> None:
    import subprocess
    import sys

    code = (
        "import sys, accel; "
        "assert not any(m.startswith('backends') for m in sys.modules), sorted(sys.modules); "
        "accel.list_backends(); assert 'backends.cpu' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
