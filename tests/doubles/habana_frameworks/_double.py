"""The recorder, knobs and undo lists shared by every module of the ``habana_frameworks`` double.

Tests read :data:`CALLS` and turn the knobs (module attributes) between calls;
:func:`reset` clears the calls and restores every knob and every piece of device state
(generator, RNG context, lazy-mode cache, acquisition) to its default. What the bridge
changes outside itself (torch patches, environment variables, the ``torch.hpu`` module,
``torch.utils.checkpoint``'s default device) goes through :func:`patch` and
:func:`setenv`, and :func:`undo_process_changes` takes all of it back.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

__all__ = [
    "BUILT_FOR_TORCH",
    "CALLS",
    "DEVICE_ACQUIRED",
    "DEVICE_COUNT",
    "ENV_WRITES",
    "FP16_SUPPORTED",
    "MAX_MEMORY_ALLOCATED",
    "MEMORY_ALLOCATED",
    "RELEASE_LAZY_DEFAULT",
    "acquire_device",
    "call_args",
    "call_names",
    "on_reset",
    "patch",
    "patched",
    "record",
    "reset",
    "setenv",
    "undo_process_changes",
]

CALLS: list[tuple[str, tuple[Any, ...]]] = []

# Knobs: read by the double when used, so a test can change them at any time (the ones
# read at import, BUILT_FOR_TORCH and RELEASE_LAZY_DEFAULT, before the bridge is imported).
DEVICE_COUNT = 1
FP16_SUPPORTED = True
MEMORY_ALLOCATED = 0
MAX_MEMORY_ALLOCATED = 0
# "major.minor" of the torch the bridge was built for; None: the running torch's.
BUILT_FOR_TORCH: str | None = None
# PT_HPU_LAZY_MODE's default in this release: "1" up to 1.20, "0" from 1.21.
RELEASE_LAZY_DEFAULT = "0"

_DEFAULTS: dict[str, Any] = {
    "DEVICE_COUNT": DEVICE_COUNT,
    "FP16_SUPPORTED": FP16_SUPPORTED,
    "MEMORY_ALLOCATED": MEMORY_ALLOCATED,
    "MAX_MEMORY_ALLOCATED": MAX_MEMORY_ALLOCATED,
    "BUILT_FOR_TORCH": BUILT_FOR_TORCH,
    "RELEASE_LAZY_DEFAULT": RELEASE_LAZY_DEFAULT,
}

# State: whether this process has acquired its card (hpu.init(), memory, streams).
DEVICE_ACQUIRED = False
# Every environment write, in order, as (name, value).
ENV_WRITES: list[tuple[str, str]] = []

_reset_hooks: list[Callable[[], None]] = []
_patches: list[tuple[Any, str, Any]] = []  # (owner, attribute, original or _MISSING)
_saved_env: dict[str, str | None] = {}
_MISSING = object()


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


def acquire_device(reason: str) -> None:
    """Acquire this process's card, as the bridge does on first real use (recorded once)."""
    global DEVICE_ACQUIRED
    if not DEVICE_ACQUIRED:
        DEVICE_ACQUIRED = True
        record("device.acquire", reason)


def patch(owner: Any, attribute: str, replacement: Any) -> None:
    """Replace ``owner.attribute`` process-wide, remembering the original for the undo."""
    # On a class only its own attribute is restored; an inherited one is deleted again.
    if isinstance(owner, type):
        original = vars(owner).get(attribute, _MISSING)
    else:
        original = getattr(owner, attribute, _MISSING)
    _patches.append((owner, attribute, original))
    setattr(owner, attribute, replacement)


def patched() -> list[str]:
    """Return what the bridge replaced, as ``"<owner>.<attribute>"``."""
    names = []
    for owner, attribute, _ in _patches:
        owner_name = getattr(owner, "__qualname__", None) or getattr(owner, "__name__", "?")
        names.append(f"{owner_name}.{attribute}")
    return names


def setenv(name: str, value: str) -> None:
    """Write an environment variable as the bridge does, remembering the old value."""
    _saved_env.setdefault(name, os.environ.get(name))
    ENV_WRITES.append((name, value))
    os.environ[name] = value


def undo_process_changes() -> None:
    """Restore every patched attribute and environment variable, newest first."""
    while _patches:
        owner, attribute, original = _patches.pop()
        if original is _MISSING:
            delattr(owner, attribute)
        else:
            setattr(owner, attribute, original)
    sys.modules.pop("torch.hpu", None)
    for name, value in _saved_env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _saved_env.clear()
    ENV_WRITES.clear()


def reset() -> None:
    """Clear :data:`CALLS` and restore every knob and all device state to the defaults."""
    global DEVICE_ACQUIRED
    CALLS.clear()
    globals().update(_DEFAULTS)
    DEVICE_ACQUIRED = False
    for hook in _reset_hooks:
        hook()
