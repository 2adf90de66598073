"""Check the built wheel and sdist hold what users and distributors need, and nothing else.

Usage: ``python .ci/check_dist.py DIST_DIR`` (the folder ``python -m build`` wrote).
Exits non-zero with one line per problem.
"""

from __future__ import annotations

import sys
import tarfile
import zipfile
from pathlib import Path

PACKAGES = ("accel", "backends", "checkpointing", "offload")
# Test helpers and doubles must never reach users' site-packages: the Habana double
# would shadow a real bridge, the fake plugins would register backends.
FORBIDDEN_IN_WHEEL = (
    "tests/",
    "habana_frameworks/",
    "habana_double",
    "accel_fake_",
    "doubles/",
    "docs/",
)
SDIST_NEEDS = (
    "README.md",
    "LICENSE",
    "CHANGELOG.md",
    "pyproject.toml",
    "MANIFEST.in",
    "tests/conftest.py",
    "tests/docs_blocks.py",
    "mkdocs.yml",
    ".readthedocs.yaml",
    "docs/index.md",
    "docs/images/demo-cpu.png",
    "docs/_build/hooks.py",
    "benchmarks/results/budget-cpu.png",
    "tests/doubles/habana_double.py",
    "examples/accel-reproducible-cpu/pyproject.toml",
    ".ci/matrix",
)


def _one(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    if len(found) != 1:
        sys.exit(f"check_dist: expected one {pattern} in {folder}, found {found}.")
    return found[0]


def check_wheel(wheel: Path) -> list[str]:
    """Return the problems with the wheel's contents (empty when it is right)."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(metadata_name).decode()
    problems = [
        f"wheel lacks {package}/py.typed"
        for package in PACKAGES
        if f"{package}/py.typed" not in names
    ]
    problems += [
        f"wheel ships {name}, a test helper"
        for name in names
        if any(part in name for part in FORBIDDEN_IN_WHEEL)
    ]
    if not any(n.endswith(".dist-info/licenses/LICENSE") for n in names):
        problems.append("wheel lacks the LICENSE file under .dist-info/licenses/")
    if "License-Expression: Apache-2.0" not in metadata:
        problems.append("wheel metadata lacks 'License-Expression: Apache-2.0'")
    if "example.invalid" in metadata:
        problems.append("wheel metadata names a placeholder URL (example.invalid)")
    return problems


def check_sdist(sdist: Path) -> list[str]:
    """Return the problems with the sdist's contents (empty when it is right)."""
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    problems = [f"sdist lacks {needed}" for needed in SDIST_NEEDS if needed not in names]
    problems += [f"sdist ships {name}, a build artefact" for name in names if "__pycache__" in name]
    return problems


def main(argv: list[str]) -> int:
    """Check ``argv[1]``'s wheel and sdist; print each problem; return the exit status."""
    if len(argv) != 2:
        sys.stderr.write("usage: python .ci/check_dist.py DIST_DIR\n")
        return 2
    folder = Path(argv[1])
    wheel, sdist = _one(folder, "*.whl"), _one(folder, "*.tar.gz")
    problems = check_wheel(wheel) + check_sdist(sdist)
    for problem in problems:
        sys.stderr.write(f"check_dist: {problem}\n")
    if not problems:
        print(f"check_dist: {wheel.name} and {sdist.name} hold what they should.")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
