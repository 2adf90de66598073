"""The pytest plugin: run tests once per backend, skip cleanly where one is missing.

A backend named explicitly (``--accel=cuda``, ``ACCEL_TEST_BACKENDS=cuda``, a marker,
``python -m accel conformance cuda``) must exist, and one named in the selection must
also be able to run here: otherwise the session stops with a usage error saying why.
``all`` and ``available`` skip what cannot run. A broken plugin never stops a session:
its warning is kept out of pytest's warning filters (``-W error`` included) and shown
in the report header instead.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import torch

from .._errors import AccelError, PluginLoadWarning
from .._protocol import Accelerator
from .._select import BackendInfo, get_backend, list_backends, plugin_failures

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
    f"(default: every available backend that auto-detection may pick). Env: {ENV_VAR}. "
    "A backend named here that cannot run is a usage error."
)
ORIGIN_HELP = (
    "how the backend selection was given, named in usage errors instead of --accel "
    "(set by `python -m accel conformance`)."
)


@contextmanager
def _quiet_plugin_warnings() -> Iterator[None]:
    """Keep PluginLoadWarning out of the session's filters; failures go to the header."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PluginLoadWarning)
        yield


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
    """The backends chosen with ``--accel`` (or ``ACCEL_TEST_BACKENDS``).

    Attributes:
        spec: The value as given (lowercased), ``all`` or ``available`` included.
        names: The backends tests run on.
        known: Every backend name installed, for checking markers.
    """

    spec: str
    names: tuple[str, ...]
    known: tuple[str, ...] = ()

    @classmethod
    def parse(
        cls, spec: str, known: Sequence[BackendInfo], *, source: str | None = None
    ) -> BackendSelection:
        """Turn an option value into backend names.

        Args:
            spec: ``all``, ``available`` or comma-separated names.
            known: What :func:`accel.list_backends` returned.
            source: How the user gave ``spec`` (``ACCEL_TEST_BACKENDS='cuda'``...),
                named in errors; default ``--accel=<spec>``.

        Raises:
            pytest.UsageError: A name is unknown, or names a backend that cannot run
                here (only ``all`` and ``available`` skip those).
        """
        given = source if source is not None else f"--accel={spec!r}"
        value = spec.strip().lower() or "available"
        known_names = tuple(dict.fromkeys(info.name for info in known))
        if value == "all":
            return cls(value, known_names, known_names)
        if value == "available":
            names = [
                info.name
                for info in known
                if info.available and info.automatic and info.priority >= 0
            ]
            return cls(value, tuple(dict.fromkeys(names)), known_names)
        names = [part.strip() for part in value.split(",") if part.strip()]
        unknown = [name for name in names if name not in known_names]
        if unknown:
            raise pytest.UsageError(
                f"{given} names unknown backend(s) {', '.join(unknown)}. "
                f"Known: {', '.join(known_names)}. Run `python -m accel` to see every "
                "backend, or pass 'all' / 'available'."
            )
        unusable = {
            info.name: info.reason for info in known if info.name in names and not info.available
        }
        if unusable:
            why = "; ".join(f"{name}: {reason}" for name, reason in unusable.items())
            usable = ", ".join(info.name for info in known if info.available) or "none"
            raise pytest.UsageError(
                f"{given} names backend(s) that cannot run here, so nothing would be "
                f"tested on them ({why}). Run on a machine where they are available, "
                f"name available ones (available here: {usable}), or pass 'all' to skip "
                "unavailable backends with the reason."
            )
        return cls(value, tuple(dict.fromkeys(names)), known_names)


_selection_key = pytest.StashKey[BackendSelection]()


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--accel``."""
    group = parser.getgroup("accel")
    group.addoption("--accel", dest="accel_backends", default=None, help=OPTION_HELP)
    group.addoption("--accel-origin", dest="accel_origin", default=None, help=ORIGIN_HELP)


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
    option: str | None = config.getoption("accel_backends")
    origin: str | None = config.getoption("accel_origin")
    if option:
        spec, source = option, origin
    elif os.environ.get(ENV_VAR, "").strip():
        spec = os.environ[ENV_VAR]
        source = f"{ENV_VAR}={spec!r}"
    else:
        spec, source = "available", None
    try:
        with _quiet_plugin_warnings():
            known = list_backends()
    except AccelError as exc:  # strict plugin mode, or a bad ACCEL_* value
        raise pytest.UsageError(str(exc)) from exc
    selection = BackendSelection.parse(spec, known, source=source)
    config.stash[_selection_key] = selection
    if selection.spec not in ("all", "available"):
        _create_named(selection, source or f"--accel={spec!r}")


def _create_named(selection: BackendSelection, given: str) -> None:
    """Create the backends named explicitly before any test runs.

    A backend whose vendor library registers a device with torch when imported must be
    imported before the first backward of the session: autograd sizes its per-device
    queues when its engine starts, and a device registered later fails there
    ("device_ready_queues_ ... INTERNAL ASSERT FAILED", seen with torch_xla 2.9.0).
    """
    for name in selection.names:
        try:
            with _quiet_plugin_warnings():
                get_backend(name)
        except AccelError as exc:
            raise pytest.UsageError(
                f"{given}: backend {name!r} could not be created: {exc}"
            ) from exc


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Show the chosen backends, and any plugin that failed to load, in pytest's header."""
    selection = config.stash[_selection_key]
    lines = [f"accel backends ({selection.spec}): {', '.join(selection.names) or 'none'}"]
    with _quiet_plugin_warnings():
        failures = plugin_failures()
    lines.extend(
        f"accel: skipped plugin {failure.provider.describe()}: {failure.error}"
        for failure in failures
    )
    return lines


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``accel_backend`` over the selected backends, ids like ``[cpu]``."""
    if "accel_backend" not in metafunc.fixturenames:
        return
    selection = metafunc.config.stash[_selection_key]
    marker = metafunc.definition.get_closest_marker("accel")
    names = list(marker.args) if marker is not None else list(selection.names)
    unknown = [name for name in names if name not in selection.known]
    if unknown:
        raise pytest.UsageError(
            f"{metafunc.definition.nodeid}: accel({', '.join(map(repr, unknown))}) names an "
            f"unknown backend; use one of {', '.join(selection.known)}."
        )
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
    with _quiet_plugin_warnings():
        rows = list_backends()
    info = next((row for row in rows if row.name == name), None)
    if info is None:
        pytest.skip(f"backend {name!r} is not installed; run `python -m accel` to list backends.")
    if not info.available:
        pytest.skip(f"backend {name!r} is unavailable: {info.reason}")
    selection = request.config.stash[_selection_key]
    if name not in selection.names:
        pytest.skip(f"backend {name!r} is not selected (--accel={selection.spec}).")
    try:
        with _quiet_plugin_warnings():
            backend = get_backend(name)
    except AccelError as exc:
        pytest.fail(f"backend {name!r} is listed as available but get_backend failed: {exc}")
    for capability in _required_capabilities(request.node):
        if not CAPABILITIES[capability](backend):
            pytest.skip(f"backend {name!r} lacks the {capability!r} capability.")
    return backend
