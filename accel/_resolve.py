"""The ``backend=`` argument every subsystem takes: a backend, its name, or ``None``."""

from __future__ import annotations

from typing import Any

from ._errors import AccelError, AccelTypeError
from ._protocol import Accelerator, iter_missing_members
from ._select import get_backend

__all__ = ["resolve_backend"]


def resolve_backend(backend: Any, subsystem: str, *, where: str = "backend") -> Accelerator:
    """Return the backend that a ``backend=`` argument names.

    One rule for every subsystem (``checkpointing``, ``offload``, the framework
    adapters): ``None`` is :func:`get_backend` (``ACCEL``, then auto-detection), a
    string is ``get_backend(name)``, and an object with every :class:`Accelerator`
    member is returned as it is. Members are checked with ``hasattr``, so a delegating
    backend that serves them through ``__getattr__`` is accepted (from Python 3.12 a
    runtime protocol check would not see them).

    Args:
        backend: A backend object, a backend name such as ``"cuda"``, or ``None``.
        subsystem: Who is asking, the prefix of every error message (``"offload"``).
        where: The argument's name in those messages.

    Returns:
        The backend.

    Raises:
        AccelTypeError: ``backend`` is neither ``None``, a string nor an object with
            every protocol member.
        accel.BackendNotFoundError, accel.BackendUnavailableError: The name is unknown,
            or its backend cannot run here (the error :func:`get_backend` raises, of the
            same class, its message prefixed with ``subsystem``).

    Example::

        import accel

        backend = accel.resolve_backend("cpu", "myproject")
        assert backend is accel.get_backend("cpu")
    """
    if backend is None:
        return get_backend()
    if isinstance(backend, str):
        try:
            return get_backend(backend)
        except AccelError as exc:
            raise _prefixed(exc, f"{subsystem}: {where}={backend!r} cannot be used: {exc}") from exc
    missing = list(iter_missing_members(backend))
    if missing:
        raise AccelTypeError(
            f"{subsystem}: {where} must be an accel backend (the object accel.get_backend() "
            f"returns), a backend name such as 'cpu', or None for the default backend; got "
            f"{type(backend).__name__} {backend!r:.60}, which lacks {', '.join(missing[:5])}"
            f"{'...' if len(missing) > 5 else ''}. Run `python -m accel` to list the backends."
        )
    result: Accelerator = backend
    return result


def _prefixed(exc: AccelError, message: str) -> AccelError:
    """Return an error of ``exc``'s class with ``message`` (an ``AccelError`` if it cannot be)."""
    try:
        return type(exc)(message)
    except TypeError:  # an error class whose constructor takes other arguments
        return AccelError(message)
