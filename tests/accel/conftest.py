"""Fixtures for the core tests: fake installed plugin distributions, replaced specs."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
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
