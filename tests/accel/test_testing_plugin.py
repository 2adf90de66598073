"""The opt-in pytest plugin ``accel.testing``, driven in pytest runs of its own (``pytester``).

Each run is ``pytest -p accel.testing`` in a temporary directory with an empty ini file
and plugin autoloading off, so this project's pytest configuration does not leak in. The
runs happen in this process (a fresh process imports torch, seconds each), with the
backends this session discovered; the test that changes what discovery finds runs in a
fresh process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

TIMEOUT_S = 600.0  # a hang guard, generous for a loaded 2-core CI machine

# A test that runs once per selected backend.
_PER_BACKEND = """
def test_x(accel_backend):
    assert accel_backend.name == accel_backend.name.strip().lower()
"""

_MARKED = """
import pytest


def test_x(accel_backend):
    pass


@pytest.mark.accel("recording")
def test_only_recording(accel_backend):
    assert accel_backend.name == "recording"


@pytest.mark.accel("{missing}")
def test_only_missing(accel_backend):
    assert accel_backend.name == "{missing}"


@pytest.mark.accel_requires("streams")
def test_needs_streams(accel_backend):
    assert accel_backend.supports_streams


def test_plain():
    pass
"""

_BAD_CAPABILITY = """
import pytest


@pytest.mark.accel_requires("nonsense")
def test_bad(accel_backend):
    pass
"""


def _without_accel_variables(env: dict[str, str]) -> dict[str, str]:
    return {
        name: value
        for name, value in env.items()
        if not name.startswith("ACCEL") and name != "PYTEST_ADDOPTS"
    }


@pytest.fixture(scope="module")
def backends(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every backend as ``python -m accel --json`` in a fresh process reports it, by name.

    A fresh process sees what the pytest subprocesses see (this session may differ, for
    example under ``-p habana_double``).
    """
    completed = subprocess.run(
        [sys.executable, "-m", "accel", "--json"],
        cwd=tmp_path_factory.mktemp("report"),
        env=_without_accel_variables(dict(os.environ)),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=True,
    )
    rows = json.loads(completed.stdout)["backends"]
    return {row["name"]: row for row in rows}


@pytest.fixture
def isolated(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A pytester directory with an empty ini file, no ACCEL* variables, no autoloading.

    Plugin autoloading is off so that only ``accel.testing`` (passed with ``-p``) is active.
    """
    for name in list(os.environ):
        if name.startswith("ACCEL"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makeini("[pytest]\n")
    return pytester


def _run(pytester: pytest.Pytester, *args: str, fresh: bool = False) -> pytest.RunResult:
    """Run pytest on ``pytester``'s files with the plugin: in this process, or a fresh one.

    In this process the backends are the ones this session discovered; a test that
    changes what discovery finds (``PYTHONPATH``, strict plugins) needs ``fresh=True``.
    """
    options = ("-p", "accel.testing", "-p", "no:cacheprovider", *args)
    if fresh:
        return pytester.runpytest_subprocess(*options, timeout=TIMEOUT_S)
    return pytester.runpytest_inprocess(*options)


def _skips(result: pytest.RunResult) -> list[str]:
    return [line for line in result.outlines if line.startswith("SKIPPED")]


def _ids(result: pytest.RunResult, test: str) -> list[str]:
    """The parametrization ids of ``test`` in ``--collect-only -q`` or ``-v`` output."""
    prefix = f"::{test}["
    ids = []
    for line in result.outlines:
        if prefix in line:
            ids.append(line.split(prefix, 1)[1].split("]", 1)[0])
    return ids


def test_default_runs_once_per_auto_detectable_backend(
    isolated: pytest.Pytester, backends: dict[str, dict[str, Any]]
) -> None:
    expected = [name for name, row in backends.items() if row["available"] and row["priority"] >= 0]
    if not any(row["available"] for name, row in backends.items() if name != "cpu"):
        # A machine with no accelerator: exactly cpu (not recording, whose priority is < 0).
        assert expected == ["cpu"]
    isolated.makepyfile(test_default=_PER_BACKEND)

    result = _run(isolated, "-v")

    assert _ids(result, "test_x") == expected
    result.stdout.fnmatch_lines(
        [
            f"accel backends (available): {', '.join(expected)}",
            *(f"test_default.py::test_x[[]{name}[]] PASSED*" for name in expected),
        ]
    )
    result.assert_outcomes(passed=len(expected))


def test_environment_variable_selects_backends(
    isolated: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCEL_TEST_BACKENDS", "recording")
    isolated.makepyfile(test_env=_PER_BACKEND)

    result = _run(isolated, "-v")

    assert _ids(result, "test_x") == ["recording"]
    result.stdout.fnmatch_lines(
        ["accel backends (recording): recording", "test_env.py::test_x[[]recording[]] PASSED*"]
    )
    result.assert_outcomes(passed=1)


def test_option_selects_several_backends_and_wins_over_the_variable(
    isolated: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCEL_TEST_BACKENDS", "recording")
    isolated.makepyfile(test_sel=_PER_BACKEND)

    result = _run(isolated, "-v", "--accel=cpu,recording")

    assert _ids(result, "test_x") == ["cpu", "recording"]
    result.stdout.fnmatch_lines(
        [
            "accel backends (cpu,recording): cpu, recording",
            "test_sel.py::test_x[[]cpu[]] PASSED*",
            "test_sel.py::test_x[[]recording[]] PASSED*",
        ]
    )
    result.assert_outcomes(passed=2)


def _missing(backends: dict[str, dict[str, Any]]) -> str:
    """An unavailable backend to mark a test with: cuda where it is missing (as on CPU torch)."""
    unavailable = [name for name, row in backends.items() if not row["available"]]
    assert unavailable, "no unavailable backend to check skipping with"
    return "cuda" if "cuda" in unavailable else unavailable[0]


def test_all_runs_every_backend_and_markers_limit_and_require(
    isolated: pytest.Pytester, backends: dict[str, dict[str, Any]]
) -> None:
    available = [name for name, row in backends.items() if row["available"]]
    unavailable = {name: row["reason"] for name, row in backends.items() if not row["available"]}
    missing = _missing(backends)
    isolated.makepyfile(test_all=_MARKED.format(missing=missing))

    # --strict-markers: both markers are registered by the plugin.
    result = _run(isolated, "-v", "-rs", "--strict-markers", "--accel=all")

    result.stdout.fnmatch_lines([f"accel backends (all): {', '.join(backends)}"])
    # test_x: once per known backend; unavailable ones skipped with what is missing.
    assert _ids(result, "test_x") == list(backends)
    result.stdout.fnmatch_lines(
        [
            f"test_all.py::test_x[[]{name}[]] {'PASSED' if row['available'] else 'SKIPPED'}*"
            for name, row in backends.items()
        ]
    )
    skips = _skips(result)
    for name, reason in unavailable.items():
        expected = f"backend {name!r} is unavailable: {reason}"
        assert any(expected in line for line in skips), (expected, skips)
    if "cuda" in unavailable:
        assert any(
            "backend 'cuda' is unavailable: no CUDA device is visible" in line for line in skips
        ), skips
    # accel("recording") / accel(missing): only that backend.
    assert _ids(result, "test_only_recording") == ["recording"]
    assert _ids(result, "test_only_missing") == [missing]
    result.stdout.fnmatch_lines(
        [
            "test_all.py::test_only_recording[[]recording[]] PASSED*",
            f"test_all.py::test_only_missing[[]{missing}[]] SKIPPED*",
        ]
    )
    # accel_requires("streams"): skipped where a backend lacks streams (cpu, recording).
    result.stdout.fnmatch_lines(
        [
            "test_all.py::test_needs_streams[[]cpu[]] SKIPPED*",
            "test_all.py::test_needs_streams[[]recording[]] SKIPPED*",
        ]
    )
    lacking = [name for name in available if f"backend {name!r} lacks the 'streams'" in str(skips)]
    assert {"cpu", "recording"} <= set(lacking), skips
    result.stdout.fnmatch_lines(["test_all.py::test_plain PASSED*"])
    result.assert_outcomes(
        # test_x on each available backend, test_only_recording, test_plain, and
        # test_needs_streams where the backend has streams
        passed=len(available) + 2 + len(available) - len(lacking),
        # test_x and test_needs_streams on each unavailable backend, test_only_missing,
        # test_needs_streams where the backend lacks streams
        skipped=2 * len(unavailable) + 1 + len(lacking),
    )


def test_marked_backend_that_is_unavailable_is_skipped_with_the_reason(
    isolated: pytest.Pytester, backends: dict[str, dict[str, Any]]
) -> None:
    missing = _missing(backends)
    isolated.makepyfile(test_marks=_MARKED.format(missing=missing))

    result = _run(isolated, "-v", "-rs", "--accel=cpu,recording")

    assert _ids(result, "test_x") == ["cpu", "recording"]
    assert _ids(result, "test_only_recording") == ["recording"]
    assert _ids(result, "test_only_missing") == [missing]
    result.stdout.fnmatch_lines(
        [
            "test_marks.py::test_only_recording[[]recording[]] PASSED*",
            f"test_marks.py::test_only_missing[[]{missing}[]] SKIPPED*",
            "test_marks.py::test_needs_streams[[]cpu[]] SKIPPED*",
        ]
    )
    skips = _skips(result)
    reason = f"backend {missing!r} is unavailable: {backends[missing]['reason']}"
    assert any(reason in line for line in skips), (reason, skips)
    assert any("backend 'cpu' lacks the 'streams' capability." in line for line in skips), skips
    result.assert_outcomes(passed=4, skipped=3)


def test_unknown_backend_is_a_usage_error(
    isolated: pytest.Pytester, backends: dict[str, dict[str, Any]]
) -> None:
    isolated.makepyfile(test_bogus=_PER_BACKEND)

    result = _run(isolated, "--accel=cpu,bogus")

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    error = result.stderr.str()
    assert "--accel='cpu,bogus' names unknown backend(s) bogus." in error, error
    assert f"Known: {', '.join(backends)}." in error, error
    assert "test_x" not in result.stdout.str()


def test_unknown_capability_is_a_usage_error(isolated: pytest.Pytester) -> None:
    isolated.makepyfile(test_caps=_BAD_CAPABILITY)

    result = _run(isolated, "--accel=cpu")

    assert result.ret in (pytest.ExitCode.USAGE_ERROR, pytest.ExitCode.INTERRUPTED)
    output = result.stdout.str() + result.stderr.str()
    assert "UsageError" in output
    assert "test_caps.py::test_bad: accel_requires('nonsense') names an unknown capability" in (
        output
    )
    assert "streams" in output.split("unknown capability", 1)[1]
    result.assert_outcomes(errors=1)


def test_named_backend_that_cannot_run_is_a_usage_error(
    isolated: pytest.Pytester,
    backends: dict[str, dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    missing = _missing(backends)
    isolated.makepyfile(test_named=_PER_BACKEND)

    result = _run(isolated, f"--accel=cpu,{missing}")

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    error = result.stderr.str()
    assert f"--accel='cpu,{missing}' names backend(s) that cannot run here" in error, error
    assert f"{missing}: {backends[missing]['reason']}" in error, error
    assert "pass 'all' to skip unavailable backends" in error, error

    # The variable is named when it was the variable.
    monkeypatch.setenv("ACCEL_TEST_BACKENDS", missing)
    result = _run(isolated)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    error = result.stderr.str()
    assert f"ACCEL_TEST_BACKENDS={missing!r} names backend(s) that cannot run here" in error
    monkeypatch.setenv("ACCEL_TEST_BACKENDS", "bogus")
    result = _run(isolated)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    error = result.stderr.str()
    assert "ACCEL_TEST_BACKENDS='bogus' names unknown backend(s) bogus." in error, error
    assert "--accel" not in error.split("names unknown", 1)[0], error


_TYPO_MARKER = """
import pytest


@pytest.mark.accel("cdua")
def test_typo(accel_backend):
    pass
"""


def test_unknown_backend_in_a_marker_is_a_usage_error(isolated: pytest.Pytester) -> None:
    isolated.makepyfile(test_typo=_TYPO_MARKER)

    result = _run(isolated, "--accel=all")

    assert result.ret in (pytest.ExitCode.USAGE_ERROR, pytest.ExitCode.INTERRUPTED)
    output = result.stdout.str() + result.stderr.str()
    assert "UsageError" in output
    assert "test_typo.py::test_typo: accel('cdua') names an unknown backend; use one of" in output
    assert "cuda" in output.split("names an unknown backend", 1)[1]
    result.assert_outcomes(errors=1)


_PLUGINS_SITE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "plugins_site")


@pytest.mark.slow
def test_a_broken_plugin_does_not_break_a_session_with_warnings_as_errors(
    isolated: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [_PLUGINS_SITE, os.environ.get("PYTHONPATH")]))
    )
    isolated.makeini("[pytest]\nfilterwarnings = error\n")
    isolated.makepyfile(test_warned=_PER_BACKEND)

    result = _run(isolated, "-W", "error", "-v", "--accel=cpu", fresh=True)

    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "accel: skipped plugin entry point 'fakebroken' of distribution "
            "accel-fake-plugins 1.0: ModuleNotFoundError*"
        ]
    )

    # Strict mode stops the session with the plugin's sentence, not an INTERNALERROR.
    monkeypatch.setenv("ACCEL_STRICT_PLUGINS", "1")
    result = _run(isolated, "--accel=cpu", fresh=True)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    error = result.stderr.str()
    assert "INTERNALERROR" not in result.stdout.str() + error
    assert "accel-fake-plugins 1.0" in error and "ACCEL_STRICT_PLUGINS is on" in error
