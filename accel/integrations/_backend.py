"""The ``backend`` argument every adapter takes: a name, a backend object, or ``None``."""

from __future__ import annotations

from .._errors import AccelTypeError
from .._protocol import Accelerator, iter_missing_members

__all__ = ["resolve_backend"]


def resolve_backend(backend: str | Accelerator | None, subsystem: str) -> Accelerator:
    """Return the backend ``backend`` names: ``None`` is :func:`accel.get_backend`.

    Args:
        backend: A backend name (as for ``get_backend``), a backend object, or ``None``
            (``ACCEL``, then auto-detection).
        subsystem: The adapter asking, for the error message (``"lightning"``).

    Raises:
        AccelTypeError: ``backend`` is neither a name, ``None``, nor an object with every
            protocol member.
        accel.BackendNotFoundError, accel.BackendUnavailableError: From ``get_backend``.
    """
    from .._select import get_backend

    if backend is None or isinstance(backend, str):
        return get_backend(backend)
    missing = list(iter_missing_members(backend))
    if missing:
        raise AccelTypeError(
            f"{subsystem}: backend={backend!r} is neither a backend name, None, nor an "
            f"accel backend (it lacks {', '.join(missing)}). Pass a name such as 'cpu', "
            "None for accel.get_backend(), or the object accel.get_backend() returns."
        )
    return backend
