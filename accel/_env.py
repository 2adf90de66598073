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

__all__ = ["ACCEL", "flag", "name_list", "selected_name"]

ACCEL = "ACCEL"
_TRUE_VALUES = frozenset({"1", "true", "yes", "on"})


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
