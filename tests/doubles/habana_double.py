"""Switch the ``habana_frameworks`` test double on and off, and a pytest plugin doing so.

Helpers::

    activation = activate(monkeypatch, tmp_path)  # monkeypatch may be None
    recorder = activation.recorder                # habana_frameworks._double
    ...
    deactivate(activation)

:func:`activate` puts ``tests/doubles`` first on ``sys.path``, creates fake Gaudi device
nodes in ``node_dir`` and points ``backends.hpu.DEVICE_NODE_GLOBS`` at them, resets the
double and calls :func:`accel.reset_backends`. :func:`deactivate` drops every
``habana_frameworks`` module from ``sys.modules``, restores ``sys.path`` and
``DEVICE_NODE_GLOBS`` and calls :func:`accel.reset_backends` again.

As a pytest plugin (``PYTHONPATH=tests/doubles python -m pytest -p habana_double``) it
activates the double for the whole session, so ``hpu`` is an available backend.
"""

from __future__ import annotations

import importlib
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import accel
import backends.hpu

__all__ = [
    "DOUBLES_DIR",
    "VENDOR_PACKAGE",
    "Activation",
    "activate",
    "deactivate",
    "purge_vendor_modules",
]

DOUBLES_DIR = Path(__file__).resolve().parent
VENDOR_PACKAGE = "habana_frameworks"


@dataclass
class Activation:
    """What :func:`activate` changed, for :func:`deactivate` to restore."""

    recorder: ModuleType
    node_dir: Path
    saved_globs: tuple[str, ...]
    monkeypatch: Any = None


def purge_vendor_modules() -> None:
    """Remove ``habana_frameworks`` and all its submodules from ``sys.modules``."""
    for name in list(sys.modules):
        if name == VENDOR_PACKAGE or name.startswith(VENDOR_PACKAGE + "."):
            del sys.modules[name]


def make_device_nodes(node_dir: Path, count: int = 1) -> tuple[str, ...]:
    """Create ``count`` fake ``accelN`` nodes in ``node_dir``; return globs matching them."""
    node_dir.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        (node_dir / f"accel{index}").touch()
    return (str(node_dir / "accel[0-9]*"),)


def activate(monkeypatch: Any, node_dir: Path, *, device_count: int = 1) -> Activation:
    """Make the double importable and present ``device_count`` fake Gaudi devices.

    Args:
        monkeypatch: A ``pytest.MonkeyPatch`` (its undo then also restores what this
            changed), or ``None``.
        node_dir: An empty directory for the fake device nodes.
        device_count: How many device nodes to create; also the double's
            ``DEVICE_COUNT`` knob.

    Returns:
        The :class:`Activation` to pass to :func:`deactivate`; its ``recorder`` is
        ``habana_frameworks._double``, freshly reset.
    """
    saved_globs = backends.hpu.DEVICE_NODE_GLOBS
    globs = make_device_nodes(node_dir, device_count)
    purge_vendor_modules()
    if monkeypatch is not None:
        monkeypatch.syspath_prepend(str(DOUBLES_DIR))
        monkeypatch.setattr(backends.hpu, "DEVICE_NODE_GLOBS", globs)
    else:
        sys.path.insert(0, str(DOUBLES_DIR))
        backends.hpu.DEVICE_NODE_GLOBS = globs
    importlib.invalidate_caches()
    recorder = importlib.import_module(f"{VENDOR_PACKAGE}._double")
    recorder.reset()
    recorder.DEVICE_COUNT = device_count
    accel.reset_backends()
    return Activation(recorder, node_dir, saved_globs, monkeypatch)


def deactivate(activation: Activation) -> None:
    """Undo :func:`activate`: forget the double's modules, restore path and globs."""
    purge_vendor_modules()
    # Remove the entry activate() put first; a PYTHONPATH entry further on stays.
    if str(DOUBLES_DIR) in sys.path:
        sys.path.remove(str(DOUBLES_DIR))
    backends.hpu.DEVICE_NODE_GLOBS = activation.saved_globs
    importlib.invalidate_caches()
    accel.reset_backends()


# pytest plugin --------------------------------------------------------------------------

_session: dict[str, Any] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Activate the double for the whole session (fake nodes in a temporary directory).

    It runs before other plugins' ``pytest_configure``, so one that lists backends at
    configuration (``accel.testing``) already sees ``hpu``.
    """
    node_dir = Path(tempfile.mkdtemp(prefix="habana-double-"))
    _session["activation"] = activate(None, node_dir)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Deactivate the session's double and delete its device nodes."""
    activation = _session.pop("activation", None)
    if activation is not None:
        deactivate(activation)
        shutil.rmtree(activation.node_dir, ignore_errors=True)
