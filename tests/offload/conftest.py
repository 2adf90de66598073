"""Fixtures for the offload tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from offload._core import transfer


def _load_helper(name: str) -> None:
    """Import ``tests/offload/<name>.py`` as module ``name`` (``--import-mode=importlib``)."""
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parent / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


# Clock streams and the race detector, for tests/offload/test_offload_streams.py.
_load_helper("_offload_streamed")
# The allocation tracer, for tests/offload/test_offload_allocations.py.
_load_helper("_offload_allocations")


def _always_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transfer, "copies_needed", lambda device, home: True)


@pytest.fixture
def copies(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make offload copy parameters between homes even where both are host memory."""
    _always_copy(monkeypatch)


@pytest.fixture(params=["zero-copy", "copy"])
def copy_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Run a test twice: parameters used in place (host memory), then copied."""
    if request.param == "copy":
        _always_copy(monkeypatch)
    return bool(request.param == "copy")
