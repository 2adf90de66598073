"""The environment variables accel reads, in one place.

=================================  ==============================================
``ACCEL``                          backend name for :func:`accel.get_backend`
``ACCEL_STRICT_PLUGINS=1``         a broken plugin raises instead of warning
``ACCEL_DISABLE_PLUGIN_AUTOLOAD=1``  load built-in backends only
``ACCEL_DISABLED_PLUGINS=a,b``     skip these entry points by name
=================================  ==============================================

On/off variables take ``1/0``, ``true/false``, ``yes/no`` or ``on/off`` in any case;
anything else raises :class:`accel.ConfigurationError`.
"""

from __future__ import annotations

import os

from ._errors import ConfigurationError

__all__ = [
    "ACCEL",
    "flag",
    "local_rank",
    "name_list",
    "raw_selected_name",
    "selected_name",
]

ACCEL = "ACCEL"
_TRUE_VALUES = frozenset({"1", "true", "yes", "on"})
_FALSE_VALUES = frozenset({"", "0", "false", "no", "off"})

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
    """Return whether the on/off ``variable`` is on.

    ``1``, ``true``, ``yes`` and ``on`` mean on; ``0``, ``false``, ``no``, ``off``, empty
    or unset mean off (any case, surrounding spaces ignored).

    Raises:
        ConfigurationError: Any other value, naming the variable and its value.
    """
    raw = os.environ.get(variable, "")
    value = raw.strip().lower()
    if value in _TRUE_VALUES:
        return True
    if value in _FALSE_VALUES:
        return False
    raise ConfigurationError(
        f"The environment variable {variable} is {raw!r}, which is not an on/off value. "
        "Set it to 1, true, yes or on to turn it on, or to 0, false, no or off (or unset "
        "it) to turn it off."
    )


def name_list(variable: str) -> frozenset[str]:
    """Return the comma-separated names in ``variable``, trimmed, empty ones dropped."""
    return frozenset(
        part.strip() for part in os.environ.get(variable, "").split(",") if part.strip()
    )


def selected_name() -> str | None:
    """Return the raw ``ACCEL`` value, or ``None`` when unset or blank."""
    value = os.environ.get(ACCEL)
    return value if value and value.strip() else None


def local_rank() -> int | None:
    """Return ``LOCAL_RANK`` as an integer, or ``None`` when unset or not an integer."""
    raw = os.environ.get("LOCAL_RANK")
    try:
        return None if raw is None else int(raw.strip())
    except ValueError:
        return None
