"""Checks on what users pass to the public functions, with messages that say what to do."""

from __future__ import annotations

from typing import Any

import accel
from accel import Accelerator

__all__ = ["require_bool", "require_optional_bool", "resolve_backend"]


def resolve_backend(backend: Any, *, where: str = "backend") -> Accelerator | None:
    """Return the backend ``backend`` names: itself, or ``accel.get_backend(name)``.

    ``None`` stays ``None`` (the caller picks :func:`accel.get_backend` when it runs).

    Raises:
        TypeError: ``backend`` is neither ``None``, a name nor an object with every
            :class:`accel.Accelerator` member.
        accel.BackendNotFoundError, accel.BackendUnavailableError: From
            :func:`accel.get_backend`, for a name that is unknown or unusable here.
    """
    if backend is None:
        return None
    if isinstance(backend, str):
        return accel.get_backend(backend)
    # hasattr, not isinstance(backend, Accelerator): from Python 3.12 a runtime protocol
    # check ignores members served by __getattr__ (as RecordingBackend serves them).
    missing = [name for name in accel.protocol_members() if not hasattr(backend, name)]
    if not missing:
        result: Accelerator = backend
        return result
    raise TypeError(
        f"checkpointing: {where} must be an accel backend (accel.get_backend(...)) or a "
        f"backend name such as 'cpu', got {backend!r} ({type(backend).__name__}"
        + (f", which lacks {', '.join(missing[:5])}" if missing else "")
        + "). Pass get_backend(name), the name itself, or None for the default backend."
    )


def require_bool(value: Any, name: str) -> bool:
    """Return ``value`` if it is a bool, else raise a ``TypeError`` naming ``name``."""
    if not isinstance(value, bool):
        raise TypeError(
            f"checkpointing: {name} must be True or False, got {value!r} "
            f"({type(value).__name__}). Pass a bool."
        )
    return value


def require_optional_bool(value: Any, name: str) -> bool | None:
    """Return ``value`` if it is a bool or ``None``, else raise a ``TypeError`` naming ``name``."""
    if value is not None and not isinstance(value, bool):
        raise TypeError(
            f"checkpointing: {name} must be True, False or None, got a "
            f"{type(value).__name__} ({value!r:.60}). Pass it by keyword: "
            f"{name}=False (recommended) or {name}=True."
        )
    return value
