"""``python -m accel``: the table, ``--json``, the reasons and one-sentence errors.

Most runs call the command's ``main`` in this process with the environment it would
see (a fresh interpreter imports torch, seconds each); ``python -m accel`` itself and
the console script run as processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

import accel
from accel._cli import main


@dataclass(frozen=True)
class Ran:
    """What a run of the command returned and printed."""

    returncode: int
    stdout: str
    stderr: str


Run = Callable[..., Ran]


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Run:
    """``run(*args, env_accel=None, **variables)``: the command's ``main`` in this process.

    Its environment has no ACCEL* variables but ``ACCEL=env_accel`` and ``variables``,
    and backends are discovered anew, as in a fresh process.
    """

    def call(*args: str, env_accel: str | None = None, **variables: str) -> Ran:
        with monkeypatch.context() as patch:
            for name in list(os.environ):
                if name.startswith("ACCEL"):
                    patch.delenv(name)
            if env_accel is not None:
                patch.setenv("ACCEL", env_accel)
            for name, value in variables.items():
                patch.setenv(name, value)
            accel.reset_backends()
            capsys.readouterr()
            try:
                code = main(list(args))
            except SystemExit as exited:
                code = exited.code if isinstance(exited.code, int) else 1
            printed = capsys.readouterr()
        accel.reset_backends()
        return Ran(code, printed.out, printed.err)

    return call


def _process(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEL")}
    return subprocess.run(
        [sys.executable, "-m", "accel", *args], capture_output=True, text=True, env=env, timeout=600
    )


def test_table_lists_every_backend_and_the_pick() -> None:
    result = _process()
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("backend"))
    assert header.split() == ["backend", "provider", "version", "status", "devices", "priority"]
    for name in ("hpu", "xla", "cuda", "xpu", "mps", "cpu", "recording"):
        assert any(line.split()[:1] == [name] for line in lines), name
    assert "Why not available:" in result.stdout
    assert "get_backend() would pick: " in result.stdout


def test_json_matches_the_table(run: Run) -> None:
    report = json.loads(run("--json").stdout)
    assert {"accel_version", "torch_version", "backends", "selected", "plugin_failures"} <= set(
        report
    )
    names = [row["name"] for row in report["backends"]]
    assert names.index("hpu") < names.index("cuda") < names.index("cpu")
    cpu = next(row for row in report["backends"] if row["name"] == "cpu")
    assert cpu == {
        **cpu,
        "provider": "built-in",
        "available": True,
        "reason": None,
        "device_count": 1,
    }
    assert report["selected"]["reason"] in {"auto", "fallback"}


def test_accel_variable_is_reported_as_the_reason(run: Run) -> None:
    report = json.loads(run("--json", env_accel="recording").stdout)
    assert report["selected"] == {"name": "recording", "reason": "ACCEL", "skipped": []}
    assert "from the ACCEL environment variable" in run(env_accel="recording").stdout


def test_bad_accel_is_shown_and_exit_is_zero(run: Run) -> None:
    result = run(env_accel="bogus")
    assert result.returncode == 0
    assert "get_backend() would fail: ACCEL='bogus' is not a known backend." in result.stdout
    report = json.loads(run("--json", env_accel="bogus").stdout)
    assert report["selected"] is None and "bogus" in report["selection_error"]


def test_unknown_arguments_are_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--frobnicate"])
    assert info.value.code == 2
    assert "unrecognized arguments: --frobnicate" in capsys.readouterr().err


def test_console_script_is_installed() -> None:
    import shutil

    # The script sits beside this interpreter, whether or not its venv is activated.
    script = shutil.which("accel", path=str(Path(sys.executable).parent))
    assert script is not None
    result = subprocess.run([script, "--json"], capture_output=True, text=True, timeout=600)
    assert json.loads(result.stdout)["backends"]


def _assert_one_sentence_error(result: Ran, *parts: str) -> None:
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("python -m accel: error: "), lines[0]
    for part in parts:
        assert part in lines[0], lines[0]


def test_strict_mode_with_a_broken_plugin_is_one_sentence(run: Run, plugin_site: Path) -> None:
    result = run(ACCEL_STRICT_PLUGINS="1")
    _assert_one_sentence_error(result, "accel-fake-plugins 1.0", "ACCEL_STRICT_PLUGINS is on")
    as_json = run("--json", ACCEL_STRICT_PLUGINS="1")
    assert as_json.returncode == 1
    report = json.loads(as_json.stdout)
    assert "accel-fake-plugins 1.0" in report["error"]
    assert "Traceback" not in as_json.stderr


def test_bad_flag_value_is_one_sentence(run: Run) -> None:
    result = run(ACCEL_DISABLE_PLUGIN_AUTOLOAD="maybe")
    _assert_one_sentence_error(result, "ACCEL_DISABLE_PLUGIN_AUTOLOAD is 'maybe'")


def test_demo_with_a_bad_accel_is_one_sentence(run: Run) -> None:
    result = run("demo", "--steps", "1", env_accel="bogus")
    _assert_one_sentence_error(result, "ACCEL='bogus' is not a known backend.")


def test_version_names_accel_torch_and_python(capsys: pytest.CaptureFixture[str]) -> None:
    import platform

    import torch

    import accel

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == (
        f"accel {accel.__version__} (torch {torch.__version__}, "
        f"Python {platform.python_version()})\n"
    )
