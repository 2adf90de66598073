"""The shipped conformance suite, run as users run it: in a fresh process, from a temp dir.

Each run is ``python -m accel conformance <name>`` (or the ``python -m pytest`` line it
stands for) in a pytester directory holding an empty ini file, so this project's pytest
configuration (``filterwarnings = error``, ``-p accel.testing``) is not used.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

# Each test here starts processes or whole pytest sessions: deselected by default (see
# [tool.pytest.ini_options]).
pytestmark = pytest.mark.slow

TIMEOUT_S = 600.0  # a hang guard, generous for a loaded 2-core CI machine
TESTS = Path(__file__).resolve().parents[1]
DOUBLES = TESTS / "doubles"
PLUGINS_SITE = TESTS / "data" / "plugins_site"


@pytest.fixture
def user_dir(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A directory of the user's, with no pytest configuration and no ACCEL* variables."""
    for name in list(os.environ):
        if name.startswith("ACCEL"):
            monkeypatch.delenv(name)
    pytester.makeini("[pytest]\n")
    return pytester


def _with_pythonpath(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(path), os.environ.get("PYTHONPATH")]))
    )


def _conformance(pytester: pytest.Pytester, backend: str, *args: str) -> pytest.RunResult:
    """Run ``python -m accel conformance <backend> -p no:cacheprovider <args>``."""
    return pytester.run(
        sys.executable,
        "-m",
        "accel",
        "conformance",
        backend,
        "-p",
        "no:cacheprovider",
        *args,
        timeout=TIMEOUT_S,
    )


def _lines(result: pytest.RunResult, outcome: str) -> list[str]:
    """The test ids of the ``-rA`` summary lines for ``outcome`` (PASSED, FAILED, ...)."""
    prefix = f"{outcome} "
    return [
        line[len(prefix) :].split(" - ", 1)[0]
        for line in result.outlines
        if line.startswith(prefix)
    ]


def _assert_clean_pass(result: pytest.RunResult) -> dict[str, int]:
    output = result.stdout.str()
    outcomes = result.parseoutcomes()
    assert result.ret == pytest.ExitCode.OK, output
    assert outcomes.get("failed", 0) == 0 and outcomes.get("errors", 0) == 0, outcomes
    # The whole suite ran, not a handful of tests.
    assert outcomes.get("passed", 0) >= 15, outcomes
    assert "conformance rule" not in output
    return outcomes


def test_cli_certifies_cpu(user_dir: pytest.Pytester) -> None:
    result = _conformance(user_dir, "cpu", "-q")

    _assert_clean_pass(result)


def test_pytest_command_certifies_recording(conformance_run: Any) -> None:
    # What `python -m accel conformance recording` stands for, typed out (beside three
    # broken backends in the same run: conftest.conformance_run).
    passed = conformance_run.ids("PASSED", "recording")
    assert len(passed) >= 15, conformance_run.output
    assert not conformance_run.ids("FAILED", "recording"), conformance_run.output
    assert not conformance_run.ids("ERROR", "recording"), conformance_run.output
    assert not conformance_run.rules("recording")
    assert "test_rng.py::test_fork_rng_restores[recording]" in passed


def test_hpu_double_passes_with_device_tensor_checks_skipped(
    user_dir: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    _with_pythonpath(monkeypatch, DOUBLES)

    result = _conformance(user_dir, "hpu", "-p", "habana_double", "-rA")

    _assert_clean_pass(result)
    result.stdout.fnmatch_lines(["accel backends (hpu): hpu"])
    passed = _lines(result, "PASSED")
    for test_id in (
        "test_rng.py::test_state_roundtrip[hpu]",
        "test_rng.py::test_manual_seed_is_deterministic[hpu]",
        "test_rng.py::test_fork_rng_restores[hpu]",
        "test_rng.py::test_fork_rng_restores_on_exception[hpu]",
        "test_rng.py::test_fork_rng_disabled[hpu]",
        "test_ordering.py::test_mark_step_any_time[hpu]",
        # Checked in a fresh process, so earlier tests' initialisation cannot skip it.
        "test_identity.py::test_queries_do_not_initialise[hpu]",
    ):
        assert test_id in passed, (test_id, passed)
    # The double cannot allocate hpu tensors on stock torch: those checks skip, saying so.
    skipped = [line for line in result.outlines if line.startswith("SKIPPED")]
    assert any(
        "backend 'hpu' lacks the 'tensors' capability" in line or "cannot allocate" in line
        for line in skipped
    ), skipped


def test_broken_backend_fails_exactly_the_fork_rng_rule(conformance_run: Any) -> None:
    assert conformance_run.returncode == pytest.ExitCode.TESTS_FAILED, conformance_run.output
    assert len(conformance_run.ids("PASSED", "fakenorestore")) >= 15, conformance_run.output
    assert not conformance_run.ids("ERROR", "fakenorestore"), conformance_run.output
    failed = conformance_run.ids("FAILED", "fakenorestore")
    assert failed, conformance_run.output
    assert all(
        re.fullmatch(
            r"test_(rng|devices_and_compile)\.py::test_fork_rng_\w+"
            r"\[fakenorestore\]",
            test_id,
        )
        for test_id in failed
    ), failed
    assert conformance_run.rules("fakenorestore") == {"fork-rng"}


CONFLICT_SITE = TESTS / "data" / "conflict_site"


def _usage_error(result: pytest.RunResult) -> str:
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    assert "passed" not in result.stdout.str() and "skipped" not in result.stdout.str()
    return result.stderr.str()


def test_certifying_a_backend_that_cannot_run_here_fails(user_dir: pytest.Pytester) -> None:
    import torch

    if torch.cuda.device_count() > 0:
        pytest.skip("cuda can run here; this checks certifying a backend that cannot.")
    error = _usage_error(_conformance(user_dir, "cuda", "-q"))
    assert (
        "`python -m accel conformance cuda` names backend(s) that cannot run here, so "
        "nothing would be tested on them (cuda: no CUDA device is visible" in error
    ), error
    assert "--accel" not in error, error


def test_certifying_an_unknown_backend_names_the_command(user_dir: pytest.Pytester) -> None:
    error = _usage_error(_conformance(user_dir, "nonexistent", "-q"))
    assert "`python -m accel conformance nonexistent` names unknown backend(s) nonexistent." in (
        error
    ), error
    assert "--accel" not in error, error


def test_certifying_a_conflicted_backend_fails(
    user_dir: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    _with_pythonpath(monkeypatch, PLUGINS_SITE)
    _with_pythonpath(monkeypatch, CONFLICT_SITE)
    error = _usage_error(_conformance(user_dir, "fakeok", "-q"))
    assert "names backend(s) that cannot run here" in error, error
    assert "Backend 'fakeok' is provided twice" in error, error
