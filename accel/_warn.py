"""Warnings attributed to the user's line, not to accel's own."""

from __future__ import annotations

import sys
import warnings

__all__ = ["warn"]


def _is_accel_frame(module_name: object) -> bool:
    return isinstance(module_name, str) and (
        module_name == "accel" or module_name.startswith("accel.")
    )


def warn(message: str, category: type[Warning]) -> None:
    """Issue ``message`` with a stack level pointing at the first caller outside accel.

    A fixed ``stacklevel`` cannot do this: discovery runs from ``get_backend``,
    ``list_backends``, ``select_backend`` and others, each at another depth.
    """
    level = 1
    frame = sys._getframe(0)
    while frame is not None and _is_accel_frame(frame.f_globals.get("__name__")):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    warnings.warn(message, category, stacklevel=level)
