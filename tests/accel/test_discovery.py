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
from backends.privateuse1 import UNREGISTERED_NAME, registered_device

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
    generic = registered_device() or UNREGISTERED_NAME
    assert names == {"cpu", "cuda", "hpu", "mps", "recording", "xla", "xpu", generic}


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


# A plugin may not take a built-in name -------------------------------------------------


def test_plugin_offering_a_builtin_name_is_refused(reserved_site: Path) -> None:
    with pytest.warns(PluginLoadWarning) as caught:
        rows = accel.list_backends()
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1, messages
    assert "entry point 'fakereserved' of distribution accel-fake-reserved 1.0" in messages[0]
    assert "backend named 'cpu', which is reserved for accel's built-in one" in messages[0]
    assert "ACCEL_DISABLED_PLUGINS=fakereserved" in messages[0]
    cpu_rows = [row for row in rows if row.name == "cpu"]
    assert [(row.provider, row.available) for row in cpu_rows] == [("built-in", True)]
    assert accel.get_backend("cpu").name == "cpu"
    assert type(accel.get_backend("cpu")).__module__ == "backends.cpu"
    # The plugin's other backend keeps working.
    assert accel.get_backend("fakeextra").name == "fakeextra"
    assert [f.provider.plugin for f in accel.plugin_failures()] == ["fakereserved"]


# Listing checks protocol members; conflicts show each provider's own spec ------------


def test_incomplete_backend_is_listed_as_unavailable_with_the_violation(
    plugin_site: Path,
) -> None:
    with pytest.warns(PluginLoadWarning):
        row = next(info for info in accel.list_backends() if info.name == "fakeincomplete")
    assert not row.available
    assert row.reason is not None
    assert "does not implement accel.Accelerator" in row.reason
    assert "lacks " in row.reason and "fork_rng" in row.reason
    assert "'Writing and certifying a backend plugin' in accel's documentation" in row.reason


def test_conflict_rows_show_each_providers_priority(conflict_site: Path) -> None:
    with pytest.warns(PluginLoadWarning):
        rows = {info.provider: info for info in accel.list_backends() if info.name == "fakeok"}
    assert rows["accel-fake-plugins"].priority == -1
    assert rows["accel-fake-dupe"].priority == -2
    assert rows["accel-fake-dupe"].description == "The second provider's fakeok."


def test_conflict_reason_is_printed_once(conflict_site: Path) -> None:
    import io

    from accel._cli import _print_table, _report

    with pytest.warns(PluginLoadWarning):
        report = _report()
    out = io.StringIO()
    _print_table(report, out)
    assert out.getvalue().count("is provided twice") == 1, out.getvalue()


# An unknown name says why it may be unknown ------------------------------------------


def test_unknown_name_of_a_plugin_that_failed_to_load(plugin_site: Path) -> None:
    with pytest.warns(PluginLoadWarning), pytest.raises(accel.BackendNotFoundError) as info:
        accel.get_backend("fakebroken")
    message = str(info.value)
    assert "Its plugin, entry point 'fakebroken' of distribution accel-fake-plugins 1.0, is " in (
        message
    )
    assert "failed to load (ModuleNotFoundError" in message
    assert "pip-install" not in message


def test_unknown_name_when_a_plugin_failed_mentions_the_failures(plugin_site: Path) -> None:
    with pytest.warns(PluginLoadWarning), pytest.raises(accel.BackendNotFoundError) as info:
        accel.get_backend("mynpu")
    message = str(info.value)
    assert "These plugins failed to load and may provide it:" in message
    assert "fakehookerror" in message and "RuntimeError: fake hook failure" in message


def test_unknown_name_with_autoload_disabled(
    plugin_site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCEL_DISABLE_PLUGIN_AUTOLOAD", "1")
    with pytest.raises(accel.BackendNotFoundError) as info:
        accel.get_backend("fakeok")
    message = str(info.value)
    assert "ACCEL_DISABLE_PLUGIN_AUTOLOAD is on, so only the built-in backends were loaded" in (
        message
    )
    assert "pip-install" not in message


def test_unknown_name_of_a_disabled_plugin(
    plugin_site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCEL_DISABLED_PLUGINS", "fakeok,fakebroken,fakehookerror,fakenohook")
    with pytest.raises(accel.BackendNotFoundError) as info:
        accel.get_backend("fakeok")
    assert "is installed but skipped because ACCEL_DISABLED_PLUGINS names it" in str(info.value)


# Strict mode and warnings -------------------------------------------------------------


def test_strict_mode_message_does_not_promise_the_others_keep_working(
    plugin_site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCEL_STRICT_PLUGINS", "yes")
    with pytest.raises(PluginLoadError) as info:
        accel.list_backends()
    message = str(info.value)
    assert "keep working" not in message
    assert "ACCEL_STRICT_PLUGINS is on" in message
    assert "unset ACCEL_STRICT_PLUGINS to skip broken plugins with a warning" in message


def test_plugin_warnings_point_at_the_callers_line(plugin_site: Path) -> None:
    with pytest.warns(PluginLoadWarning) as caught:
        accel.get_backend("cpu")
    assert {w.filename for w in caught} == {__file__}
    accel.reset_backends()
    with pytest.warns(PluginLoadWarning) as caught:
        accel.list_backends()
    assert {w.filename for w in caught} == {__file__}
