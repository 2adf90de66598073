"""The supported versions are stated once and agree everywhere they appear.

pyproject.toml declares the floors, .ci/matrix runs the oldest and newest cells, and the
"Supported versions" page (docs/versions.md) lists them; a change to one without the others fails.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = (ROOT / "pyproject.toml").read_text()
MATRIX = (ROOT / ".ci" / "matrix").read_text()
VERSIONS = (ROOT / "docs" / "versions.md").read_text()
DOCS = "\n".join(page.read_text() for page in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])


def _matrix(name: str) -> str:
    found = re.search(rf"\b{name}=(\S+)", MATRIX)
    assert found is not None, f".ci/matrix sets no {name}"
    return found.group(1)


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("+")[0].split(".")[:2])


def test_distribution_name_is_our_own() -> None:
    assert re.search(r'^name = "accel-hal"$', PYPROJECT, flags=re.MULTILINE)
    plugin = (ROOT / "examples" / "accel-reproducible-cpu" / "pyproject.toml").read_text()
    assert 'dependencies = ["accel-hal>=0.1"]' in plugin
    assert 'dependencies = ["accel-hal>=0.1"]' in (ROOT / "docs" / "plugins.md").read_text()
    assert '"accel>=' not in DOCS + plugin
    sources = "\n".join(path.read_text() for path in (ROOT / "accel").rglob("*.py"))
    assert "'accel[" not in DOCS + sources  # extras are installed as accel-hal[...]


def test_floors_are_the_matrix_oldest_cell() -> None:
    python_floor = re.search(r'requires-python = ">=(\d+\.\d+)"', PYPROJECT)
    torch_floor = re.search(r'"torch>=(\d+\.\d+)"', PYPROJECT)
    assert python_floor is not None and torch_floor is not None
    assert _matrix("OLDEST_PYTHON") == python_floor.group(1)
    assert _release(_matrix("OLDEST_TORCH")) == _release(torch_floor.group(1))
    assert f"| {_matrix('OLDEST_PYTHON')} | {_matrix('OLDEST_TORCH')} " in VERSIONS
    assert f"| {_matrix('NEWEST_PYTHON')} | {_matrix('NEWEST_TORCH')} " in VERSIONS


def test_running_versions_are_supported() -> None:
    python_floor = re.search(r'requires-python = ">=(\d+)\.(\d+)"', PYPROJECT)
    assert python_floor is not None
    assert sys.version_info[:2] >= (int(python_floor.group(1)), int(python_floor.group(2)))
    assert _release(torch.__version__) >= _release(_matrix("OLDEST_TORCH"))


def test_classifiers_cover_the_matrix() -> None:
    for minor in range(int(_matrix("OLDEST_PYTHON").split(".")[1]), 14):
        assert f'"Programming Language :: Python :: 3.{minor}",' in PYPROJECT


def test_version_is_written_once() -> None:
    import accel

    assert 'dynamic = ["version"]' in PYPROJECT
    assert 'version = { attr = "accel._version.__version__" }' in PYPROJECT
    project_table = PYPROJECT.split("\n[project]\n", 1)[1].split("\n[", 1)[0]
    assert not re.search(r"^version = ", project_table, flags=re.MULTILINE)
    written = re.findall(
        r'^__version__ = "([^"]+)"$',
        (ROOT / "accel" / "_version.py").read_text(),
        flags=re.MULTILINE,
    )
    assert written == [accel.__version__]


def test_changelog_covers_the_version() -> None:
    import accel

    changelog = (ROOT / "CHANGELOG.md").read_text()
    released = re.search(
        rf"^## \[{re.escape(accel.__version__)}\] - \d{{4}}-\d{{2}}-\d{{2}}$",
        changelog,
        flags=re.MULTILINE,
    )
    # Until a version is tagged, its changes sit under "Unreleased".
    assert released or "\n## [Unreleased]\n" in changelog


def test_license_is_the_declared_one() -> None:
    assert 'license = "Apache-2.0"' in PYPROJECT
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert "example.invalid" not in PYPROJECT
