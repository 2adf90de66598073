"""Choosing a backend: explicit name, else ``ACCEL``, else auto-detection; cached."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Literal

from . import _env
from ._discovery import Catalog, CatalogEntry, PluginFailure, discover
from ._errors import (
    AccelTypeError,
    BackendConflictError,
    BackendFallbackWarning,
    BackendNotFoundError,
    BackendUnavailableError,
    ProtocolViolationError,
)
from ._protocol import Accelerator, iter_missing_members
from ._status import (
    class_violation,
    conflict_availability,
    probe,
    status,
    violation_message,
    why_unknown,
)
from ._warn import warn

__all__ = [
    "BackendInfo",
    "Selection",
    "get_backend",
    "list_backends",
    "plugin_failures",
    "reset_backends",
    "select_backend",
]

_logger = logging.getLogger("accel")

SelectionReason = Literal["explicit", "ACCEL", "auto", "fallback"]


@dataclass(frozen=True)
class BackendInfo:
    """One row of :func:`list_backends`.

    Attributes:
        name: The name to select it with.
        description: One line from its provider.
        provider: The distribution that provides it, or ``"built-in"``.
        version: That distribution's version (accel's own for built-ins).
        plugin: The entry point name (the module for built-ins).
        available: Whether it can run here.
        reason: Why not, when ``available`` is false.
        device_count: Devices this process can see.
        priority: Its place in auto-detection (highest first; negative: never auto).
        automatic: Whether auto-detection may pick it here (see
            :attr:`Availability.automatic`; ``reason`` then says why not).
    """

    name: str
    description: str
    provider: str
    version: str
    plugin: str
    available: bool
    reason: str | None
    device_count: int
    priority: int
    automatic: bool = True


@dataclass(frozen=True)
class Selection:
    """Which backend :func:`get_backend` picks, and why.

    Attributes:
        name: The backend's name.
        reason: ``explicit`` (a name was passed), ``ACCEL`` (the environment
            variable), ``auto`` (the highest-priority available accelerator) or
            ``fallback`` (no accelerator found, so ``cpu``).
        skipped: Backends auto-detection passed over although their probe said
            available, because creating them raised earlier in this process, each as
            ``"<name>: <error>"``, best first. Empty for explicit and ``ACCEL`` picks.
    """

    name: str
    reason: SelectionReason
    skipped: tuple[str, ...] = ()


_lock = threading.RLock()
_catalog: Catalog | None = None
_instances: dict[str, Accelerator] = {}
# Explicit names are cached by name; name=None by the raw ACCEL value, so a later change
# of ACCEL is honoured (it changes the key) while a cached call stays a dict lookup.
_by_name: dict[str, Accelerator] = {}
_by_environment: dict[str | bytes | None, Accelerator] = {}
# Auto-detected backends whose factory raised: name -> "ErrorType: message".
_factory_failures: dict[str, str] = {}
# Backends that bind their device when created: name -> LOCAL_RANK at that moment.
_local_ranks_at_creation: dict[str, int | None] = {}


def get_backend(name: str | None = None) -> Accelerator:
    """Return the backend to run on, creating it on first use.

    Args:
        name: Backend name (trimmed, case-insensitive). ``None`` reads ``ACCEL``,
            and when that is unset too, picks the highest-priority available
            accelerator (hpu, then a PrivateUse1 device, cuda, then others), else ``cpu``.
            When auto-detection's pick fails to start (its factory raises), it warns
            once with :class:`BackendFallbackWarning` and takes the next available
            backend, down to ``cpu``; a name or ``ACCEL`` raises instead.

    Returns:
        The same instance for the same backend name, for the life of the process
        (until :func:`reset_backends`).

    Raises:
        AccelTypeError: ``name`` is neither a string nor ``None``.
        BackendNotFoundError: No backend has that name.
        BackendUnavailableError: It exists but cannot run here.
        BackendConflictError: Two plugins provide that name.
        ProtocolViolationError: Its plugin returned an incomplete object.

    Example::

        from accel import get_backend

        backend = get_backend()
        model.to(backend.device())
    """
    if name is not None:
        try:
            return _by_name[name]
        except (KeyError, TypeError):  # TypeError: unhashable, so certainly not a str
            pass
        _check_name_type(name)
        backend = _by_name[name] = _resolve(name)
        return backend
    raw_accel = _env.raw_selected_name()
    cached = _by_environment.get(raw_accel)
    if cached is None:
        cached = _by_environment[raw_accel] = _resolve(None)
    return cached


def _check_name_type(name: object) -> None:
    if not isinstance(name, str):
        raise AccelTypeError(
            f"A backend name must be a str such as 'cpu' or 'cuda', or None for "
            f"auto-detection; got {type(name).__name__} {name!r}. Pass the name as a "
            "string; run `python -m accel` to see every backend."
        )


def _resolve(name: str | None) -> Accelerator:
    with _lock:
        selection = select_backend(name)
        if selection.reason not in ("auto", "fallback"):
            return _instance(selection.name)
        return _auto_instance(selection)


def _auto_instance(selection: Selection) -> Accelerator:
    """Create auto-detection's pick; where its factory raises, warn and take the next."""
    failed: list[BackendUnavailableError] = []
    while True:
        for error in failed:
            warn(f"{error} Auto-detection uses {selection.name!r} instead.", BackendFallbackWarning)
        failed.clear()
        try:
            return _instance(selection.name)
        except BackendUnavailableError as exc:
            cause = exc.__cause__
            _factory_failures[selection.name] = f"{type(cause).__name__}: {cause}"
            failed.append(exc)
        try:
            selection = select_backend()
        except BackendUnavailableError as exc:
            raise exc from failed[-1]


def select_backend(name: str | None = None) -> Selection:
    """Return which backend :func:`get_backend` would use and why, without creating it.

    Args:
        name: As for :func:`get_backend`.

    Raises:
        AccelError: The errors of :func:`get_backend`, except that
            :class:`ProtocolViolationError` is raised only where the factory is a class
            lacking members (a returned object is checked when it is created).
    """
    if name is not None:
        _check_name_type(name)
    catalog = _loaded_catalog()
    if name is not None:
        return Selection(_checked_name(catalog, name, f"get_backend({name!r})"), "explicit")
    env_value = _env.selected_name()
    if env_value is not None:
        return Selection(_checked_name(catalog, env_value, f"ACCEL={env_value!r}"), "ACCEL")
    return _auto_detect(catalog)


def list_backends() -> list[BackendInfo]:
    """Return every known backend, sorted by auto-detection priority.

    Availability is probed without initialising any device. A name offered by two
    plugins appears once per provider (each with its own description and priority),
    marked unavailable with the conflict as reason. A factory that is a class lacking
    protocol members is listed as unavailable, naming them.
    """
    rows: list[BackendInfo] = []
    for entry in _by_priority(_loaded_catalog()):
        availability = status(entry)
        for spec, provider in zip(entry.specs, entry.providers, strict=True):
            rows.append(
                BackendInfo(
                    name=spec.name,
                    description=spec.description,
                    provider=provider.distribution,
                    version=provider.version,
                    plugin=provider.plugin,
                    available=availability.available,
                    reason=availability.reason,
                    device_count=availability.device_count,
                    priority=spec.priority,
                    automatic=availability.automatic,
                )
            )
    return rows


def plugin_failures() -> list[PluginFailure]:
    """Return the plugins that failed to load (each was also reported as a warning)."""
    return list(_loaded_catalog().failures)


def reset_backends() -> None:
    """Forget discovered plugins and created backends.

    The next call discovers plugins again. For tests, and for a long-running process
    that installed a plugin after its first :func:`get_backend`.
    """
    global _catalog
    with _lock:
        _catalog = None
        _instances.clear()
        _by_name.clear()
        _by_environment.clear()
        _factory_failures.clear()
        _local_ranks_at_creation.clear()


def _loaded_catalog() -> Catalog:
    global _catalog
    with _lock:
        if _catalog is None:
            _catalog = discover()
        return _catalog


def _by_priority(catalog: Catalog) -> list[CatalogEntry]:
    return sorted(catalog.entries.values(), key=lambda e: (-e.spec.priority, e.spec.name))


def _known_names(catalog: Catalog) -> str:
    return ", ".join(sorted(catalog.entries)) or "none"


def _available_names(catalog: Catalog) -> str:
    names = [entry.spec.name for entry in _by_priority(catalog) if status(entry).available]
    return ", ".join(names) or "none"


def _checked_name(catalog: Catalog, raw_name: str, source: str) -> str:
    name = raw_name.strip().lower()
    entry = catalog.entries.get(name)
    if entry is None:
        raise BackendNotFoundError(
            f"{source} is not a known backend. Known backends: {_known_names(catalog)}. "
            f"{why_unknown(catalog, name)} Run `python -m accel` to see every backend."
        )
    _raise_if_conflicted(entry)
    violation = class_violation(entry)
    if violation is not None:
        raise ProtocolViolationError(violation)
    availability = probe(entry, named=True)
    if not availability.available:
        raise BackendUnavailableError(
            f"{source} is not usable here: {availability.reason} "
            f"Available: {_available_names(catalog)}. "
            "Run `python -m accel` to see every backend."
        )
    return name


def _auto_detect(catalog: Catalog) -> Selection:
    skipped: list[str] = []
    for entry in _by_priority(catalog):
        name = entry.spec.name
        availability = status(entry)
        if entry.spec.priority < 0 or not availability.available or not availability.automatic:
            continue
        if name in _factory_failures:
            skipped.append(f"{name}: {_factory_failures[name]}")
            continue
        reason: SelectionReason = "auto" if entry.spec.priority > 0 else "fallback"
        _logger.info("accel: selected backend %r (%s)", name, reason)
        return Selection(name, reason, tuple(skipped))
    failed = f" Failed to start: {'; '.join(skipped)}." if skipped else ""
    raise BackendUnavailableError(
        "No backend is usable here: auto-detection found no available backend, not even "
        f"cpu.{failed} Known backends: {_known_names(catalog)}. Run `python -m accel` to "
        "see why each is unavailable, then set ACCEL to one that is."
    )


def _raise_if_conflicted(entry: CatalogEntry) -> None:
    conflict = conflict_availability(entry)
    if conflict is not None:
        raise BackendConflictError(conflict.reason)


def _instance(name: str) -> Accelerator:
    existing = _instances.get(name)
    if existing is not None:
        return existing
    entry = _loaded_catalog().entries[name]
    provider = entry.providers[0].describe()
    if entry.spec.binds_device_at_creation:
        _local_ranks_at_creation[name] = _env.local_rank()
    try:
        backend = entry.spec.factory()
    except Exception as exc:
        raise BackendUnavailableError(
            f"Backend {name!r} from {provider} could not be created: "
            f"{type(exc).__name__}: {exc}. Run `python -m accel` to check its status."
        ) from exc
    _check_protocol(name, provider, backend)
    _instances[name] = backend
    return backend


def binds_device_at_creation(name: str) -> bool:
    """Whether the backend called ``name`` binds its device when created (see BackendSpec)."""
    with _lock:
        entry = _loaded_catalog().entries.get(name.strip().lower())
    return entry is not None and entry.spec.binds_device_at_creation


def local_rank_at_creation(name: str) -> tuple[bool, int | None]:
    """``(True, LOCAL_RANK then)`` if accel created backend ``name`` and it binds its device."""
    with _lock:
        if name in _local_ranks_at_creation:
            return True, _local_ranks_at_creation[name]
    return False, None


def _check_protocol(name: str, provider: str, backend: object) -> None:
    missing = list(iter_missing_members(backend))
    if missing:
        spec = _loaded_catalog().entries[name].spec
        raise ProtocolViolationError(violation_message(spec, provider, type(backend), missing))
    if backend.name != name:  # type: ignore[attr-defined]
        raise ProtocolViolationError(
            f"Backend {name!r} from {provider} reports its name as "
            f"{backend.name!r}; Accelerator.name must equal the BackendSpec name."  # type: ignore[attr-defined]
        )
