"""The environment variables accel reads, in one place.

=================================  ==============================================
``ACCEL``                          backend name for :func:`accel.get_backend`
``ACCEL_STRICT_PLUGINS=1``         a broken plugin raises instead of warning
``ACCEL_DISABLE_PLUGIN_AUTOLOAD=1``  load built-in backends only
``ACCEL_DISABLED_PLUGINS=a,b``     skip these entry points by name
=================================  ==============================================
"""

from __future__ import annotations

import os

__all__ = ["ACCEL", "flag", "name_list", "raw_selected_name", "selected_name"]

ACCEL = "ACCEL"
_TRUE_VALUES = frozenset({"1", "true", "yes", "on"})

# os.environ.get() of an unset variable raises and catches KeyError inside
# Mapping.get (~0.7 us); the cached get_backend() path reads ACCEL on every call, so on
# CPython/POSIX it looks the variable up in the dict behind os.environ, which every
# os.environ write keeps current.
_POSIX_ENV_DATA: dict[bytes, bytes] | None = (
    getattr(os.environ, "_data", None) if os.name == "posix" else None
)
_ACCEL_BYTES = os.fsencode(ACCEL)


def raw_selected_name() -> str | bytes | None:
    """Return the raw ``ACCEL`` value as cheaply as possible (a cache key, not a name)."""
    if _POSIX_ENV_DATA is not None:
        return _POSIX_ENV_DATA.get(_ACCEL_BYTES)
    return os.environ.get(ACCEL)


def flag(variable: str) -> bool:
    """Return whether ``variable`` is set to a true value (1, true, yes, on)."""
    return os.environ.get(variable, "").strip().lower() in _TRUE_VALUES


def name_list(variable: str) -> frozenset[str]:
    """Return the comma-separated names in ``variable``, trimmed, empty ones dropped."""
    return frozenset(
        part.strip() for part in os.environ.get(variable, "").split(",") if part.strip()
    )


def selected_name() -> str | None:
    """Return the raw ``ACCEL`` value, or ``None`` when unset or blank."""
    value = os.environ.get(ACCEL)
    return value if value and value.strip() else None
