"""accel's four packages come from one installation: the checkout's or the installed wheel's.

CI runs this file against the wheel from outside the source tree with
``ACCEL_TEST_INSTALLED_PREFIX`` set to the fresh venv's site-packages; a module imported
from the checkout instead fails it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

PACKAGES = ("accel", "backends", "checkpointing", "offload")


def _root(module_name: str) -> Path:
    module = __import__(module_name)
    assert module.__file__ is not None
    return Path(module.__file__).resolve().parent.parent


def test_packages_share_one_root() -> None:
    roots = {name: _root(name) for name in PACKAGES}
    assert len(set(roots.values())) == 1, roots


def test_every_loaded_module_comes_from_that_root() -> None:
    root = _root("accel")
    strays = {
        name: module.__file__
        for name, module in list(sys.modules.items())
        if name.split(".")[0] in PACKAGES
        and getattr(module, "__file__", None)
        and not Path(module.__file__).resolve().is_relative_to(root)
    }
    assert strays == {}


def test_installed_prefix_when_ci_names_one() -> None:
    expected = os.environ.get("ACCEL_TEST_INSTALLED_PREFIX")
    root = _root("accel")
    if expected:
        assert root == Path(expected).resolve(), f"accel was imported from {root}, not {expected}"
        assert not (root / "tests").exists()
    else:
        # From a checkout the packages sit beside pyproject.toml; from a wheel they don't.
        assert (root / "pyproject.toml").exists() or root.name in {"site-packages", "dist-packages"}
