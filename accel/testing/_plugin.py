"""The pytest plugin: run tests once per backend, skip cleanly where one is missing."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest
import torch

from .._errors import AccelError
from .._protocol import Accelerator
from .._select import BackendInfo, get_backend, list_backends

__all__ = [
    "CAPABILITIES",
    "BackendSelection",
    "accel_backend",
    "pytest_addoption",
    "pytest_configure",
    "pytest_generate_tests",
    "pytest_report_header",
]

ENV_VAR = "ACCEL_TEST_BACKENDS"
OPTION_HELP = (
    "backends to run accel_backend tests on: a comma-separated list of names, 'all' "
    "(every known backend; unavailable ones are skipped with the reason), or 'available' "
    f"(default: every available backend that auto-detection may pick). Env: {ENV_VAR}."
)


def _can_allocate(backend: Accelerator) -> bool:
    # Stock torch raises different errors for a device type it was not built for
    # (RuntimeError, NotImplementedError, ModuleNotFoundError for torch.hpu...).
    try:
        torch.empty(1, device=backend.device())
    except Exception:
        return False
    return True


CAPABILITIES: dict[str, Callable[[Accelerator], bool]] = {
    "asynchronous": lambda backend: backend.is_asynchronous,
    "bf16": lambda backend: backend.is_bf16_supported(),
    "fp16": lambda backend: backend.is_fp16_supported(),
    "lazy": lambda backend: backend.is_lazy,
    "memory_stats": lambda backend: backend.supports_memory_stats,
    "pinned_memory": lambda backend: backend.supports_pinned_memory,
    "streams": lambda backend: backend.supports_streams,
    "tensors": _can_allocate,
}
"""Names accepted by ``@pytest.mark.accel_requires``, each with its check."""


@dataclass(frozen=True)
class BackendSelection:
    """The backends chosen with ``--accel`` (or ``ACCEL_TEST_BACKENDS``)."""

    spec: str
    names: tuple[str, ...]

    @classmethod
    def parse(cls, spec: str, known: Sequence[BackendInfo]) -> BackendSelection:
        """Turn an option value into backend names; unknown names are a usage error."""
        value = spec.strip().lower() or "available"
        known_names = list(dict.fromkeys(info.name for info in known))
        if value == "all":
            return cls(value, tuple(known_names))
        if value == "available":
            names = [info.name for info in known if info.available and info.priority >= 0]
            return cls(value, tuple(dict.fromkeys(names)))
        names = [part.strip() for part in value.split(",") if part.strip()]
        unknown = [name for name in names if name not in known_names]
        if unknown:
            raise pytest.UsageError(
                f"--accel={spec!r} names unknown backend(s) {', '.join(unknown)}. "
                f"Known: {', '.join(known_names)}. Run `python -m accel` to see every "
                "backend, or pass 'all' / 'available'."
            )
        return cls(value, tuple(dict.fromkeys(names)))


_selection_key = pytest.StashKey[BackendSelection]()


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--accel``."""
    group = parser.getgroup("accel")
    group.addoption("--accel", dest="accel_backends", default=None, help=OPTION_HELP)


def pytest_configure(config: pytest.Config) -> None:
    """Register the markers and resolve the backend selection once per session."""
    config.addinivalue_line(
        "markers",
        "accel(*names): run this test only on the named backends (others are skipped).",
    )
    config.addinivalue_line(
        "markers",
        "accel_requires(*capabilities): skip on backends lacking a capability; one of "
        + ", ".join(sorted(CAPABILITIES))
        + ".",
    )
    spec = config.getoption("accel_backends") or os.environ.get(ENV_VAR, "available")
    config.stash[_selection_key] = BackendSelection.parse(spec, list_backends())


def pytest_report_header(config: pytest.Config) -> str:
    """Show the chosen backends in pytest's header."""
    selection = config.stash[_selection_key]
    return f"accel backends ({selection.spec}): {', '.join(selection.names) or 'none'}"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``accel_backend`` over the selected backends, ids like ``[cpu]``."""
    if "accel_backend" not in metafunc.fixturenames:
        return
    selected = metafunc.config.stash[_selection_key].names
    marker = metafunc.definition.get_closest_marker("accel")
    names = list(marker.args) if marker is not None else list(selected)
    for capability in _required_capabilities(metafunc.definition):
        if capability not in CAPABILITIES:
            raise pytest.UsageError(
                f"{metafunc.definition.nodeid}: accel_requires({capability!r}) names an "
                f"unknown capability; use one of {', '.join(sorted(CAPABILITIES))}."
            )
    metafunc.parametrize("accel_backend", names, ids=names, indirect=True)


def _required_capabilities(node: pytest.Item) -> list[str]:
    return [name for mark in node.iter_markers("accel_requires") for name in mark.args]


@pytest.fixture
def accel_backend(request: pytest.FixtureRequest) -> Accelerator:
    """The backend this run of the test is for; skipped where it cannot run.

    Requested by a test, it makes pytest run the test once per selected backend.
    """
    name: str = request.param
    info = next((row for row in list_backends() if row.name == name), None)
    if info is None:
        pytest.skip(f"backend {name!r} is not installed; run `python -m accel` to list backends.")
    if not info.available:
        pytest.skip(f"backend {name!r} is unavailable: {info.reason}")
    selection = request.config.stash[_selection_key]
    if name not in selection.names:
        pytest.skip(f"backend {name!r} is not selected (--accel={selection.spec}).")
    try:
        backend = get_backend(name)
    except AccelError as exc:
        pytest.fail(f"backend {name!r} is listed as available but get_backend failed: {exc}")
    for capability in _required_capabilities(request.node):
        if not CAPABILITIES[capability](backend):
            pytest.skip(f"backend {name!r} lacks the {capability!r} capability.")
    return backend
