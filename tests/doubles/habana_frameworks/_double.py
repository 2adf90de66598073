"""The recorder and knobs shared by every module of the ``habana_frameworks`` double.

Tests read :data:`CALLS` and turn the knobs (module attributes) between calls;
:func:`reset` clears the calls and restores every knob and every piece of device state
(current stream, generator) to its default.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = [
    "CALLS",
    "DEVICE_COUNT",
    "FP16_SUPPORTED",
    "MAX_MEMORY_ALLOCATED",
    "MEMORY_ALLOCATED",
    "call_args",
    "call_names",
    "on_reset",
    "record",
    "reset",
]

CALLS: list[tuple[str, tuple[Any, ...]]] = []

# Knobs: read by the double on every call, so a test can change them at any time.
DEVICE_COUNT = 1
FP16_SUPPORTED = True
MEMORY_ALLOCATED = 0
MAX_MEMORY_ALLOCATED = 0

_DEFAULTS: dict[str, Any] = {
    "DEVICE_COUNT": DEVICE_COUNT,
    "FP16_SUPPORTED": FP16_SUPPORTED,
    "MEMORY_ALLOCATED": MEMORY_ALLOCATED,
    "MAX_MEMORY_ALLOCATED": MAX_MEMORY_ALLOCATED,
}
_reset_hooks: list[Callable[[], None]] = []


def record(name: str, *args: Any) -> None:
    """Append ``(name, args)`` to :data:`CALLS`."""
    CALLS.append((name, args))


def call_names() -> list[str]:
    """Return the names in :data:`CALLS`, in order."""
    return [name for name, _ in CALLS]


def call_args(name: str) -> list[tuple[Any, ...]]:
    """Return the arguments of every recorded call to ``name``, in order."""
    return [args for called, args in CALLS if called == name]


def on_reset(hook: Callable[[], None]) -> None:
    """Run ``hook`` on every :func:`reset` (modules register their state's reset)."""
    _reset_hooks.append(hook)


def reset() -> None:
    """Clear :data:`CALLS` and restore every knob and all device state to the defaults."""
    CALLS.clear()
    globals().update(_DEFAULTS)
    for hook in _reset_hooks:
        hook()
