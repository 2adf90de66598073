"""Fixtures for the offload tests."""

from __future__ import annotations

import pytest

from offload import _transfer


def _always_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_transfer, "copies_needed", lambda device, home: True)


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
