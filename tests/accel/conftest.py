"""Fixtures for the core tests: fake installed plugin distributions, replaced specs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

import accel
from accel import _select
from accel._discovery import Catalog

DATA = Path(__file__).resolve().parents[1] / "data"


def _forget_fake_modules() -> None:
    for name in [n for n in sys.modules if n.startswith("accel_fake")]:
        del sys.modules[name]


def _install(monkeypatch: pytest.MonkeyPatch, site: str) -> Path:
    """Put the fake distributions under ``tests/data/<site>`` on sys.path."""
    path = DATA / site
    monkeypatch.syspath_prepend(str(path))
    accel.reset_backends()
    return path


@pytest.fixture
def plugin_site(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Install (on sys.path) accel-fake-plugins 1.0 and its six entry points."""
    path = _install(monkeypatch, "plugins_site")
    yield path
    _forget_fake_modules()


@pytest.fixture
def conflict_site(plugin_site: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Also install accel-fake-dupe 2.0, a second provider of ``fakeok``."""
    path = _install(monkeypatch, "conflict_site")
    return path


@pytest.fixture
def fallback_site(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Install accel-fake-fallback 1.0: ``fakefailing`` (priority 500) looks available
    and its factory raises."""
    path = _install(monkeypatch, "fallback_site")
    yield path
    _forget_fake_modules()


@pytest.fixture
def reserved_site(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Install accel-fake-reserved 1.0, which offers ``cpu`` (reserved) and ``fakeextra``."""
    path = _install(monkeypatch, "reserved_site")
    yield path
    _forget_fake_modules()


ReplaceSpec = Callable[..., None]


@pytest.fixture
def replace_spec(monkeypatch: pytest.MonkeyPatch) -> ReplaceSpec:
    """``replace_spec(name, **changes)``: the built-in backend ``name``'s spec, changed,
    for the rest of the test (as a plugin could have written it)."""

    def apply(name: str, **changes: object) -> None:
        catalog = _select._loaded_catalog()
        entry = catalog.entries[name]
        entries = dict(catalog.entries)
        entries[name] = replace(entry, specs=(replace(entry.spec, **changes),))
        monkeypatch.setattr(_select, "_catalog", Catalog(entries=entries, failures=()))

    return apply


#: The backends of one conformance run that several tests read: a healthy one and three
#: plugins that each break one rule (``tests/data/plugins_site``, ``tests/data/rules_site``).
SEVERAL = ("recording", "fakenorestore", "fakecardcount", "fakelivestate")

_SECTION = re.compile(r"^_{3,} (\S+) _{3,}$")
_RULE = re.compile(r"conformance rule ([a-z0-9-]+) \(")


@dataclass(frozen=True)
class SuiteRun:
    """One pytest run of the conformance suite over several backends, read per backend."""

    returncode: int
    output: str

    def ids(self, outcome: str, backend: str) -> list[str]:
        """The test ids of ``backend``'s ``-rA`` summary lines for ``outcome`` (``PASSED``...)."""
        prefix = f"{outcome} "
        found = []
        for line in self.output.splitlines():
            if line.startswith(prefix):
                test_id = line[len(prefix) :].split(" - ", 1)[0]
                if test_id.endswith(f"[{backend}]"):
                    found.append(test_id)
        return found

    def rules(self, backend: str) -> set[str]:
        """The conformance rules named in ``backend``'s failure sections."""
        named: set[str] = set()
        current = ""
        for line in self.output.splitlines():
            header = _SECTION.match(line)
            if header:
                current = header.group(1)
            elif line.startswith("====="):
                current = ""
            elif current.endswith(f"[{backend}]"):
                named.update(_RULE.findall(line))
        return named


@pytest.fixture(scope="session")
def conformance_run(tmp_path_factory: pytest.TempPathFactory) -> SuiteRun:
    """The suite over :data:`SEVERAL`, as a user types it, in one fresh process.

    ``python -m pytest -p accel.testing --pyargs accel.conformance --accel=...`` from a
    directory holding an empty ini file, with no ACCEL* variables and the fake plugin
    sites on ``PYTHONPATH``. One process for all four backends: each fresh process
    imports torch and compiles the suite's checks again (tens of seconds).
    """
    folder = tmp_path_factory.mktemp("conformance")
    (folder / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("ACCEL") and name != "PYTEST_ADDOPTS"
    }
    sites = [str(DATA / "plugins_site"), str(DATA / "rules_site"), env.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, sites))
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "accel.testing",
            "-p",
            "no:cacheprovider",
            "--pyargs",
            "accel.conformance",
            f"--accel={','.join(SEVERAL)}",
            "-rA",
        ],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,  # a hang guard, generous for a loaded 2-core CI machine
    )
    return SuiteRun(completed.returncode, completed.stdout + completed.stderr)
