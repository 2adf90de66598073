"""Double of ``habana_frameworks.torch.utils.internal``."""

from __future__ import annotations

import os

from habana_frameworks import _double

__all__ = ["is_lazy", "lazy_mode"]

_cached: list[bool] = []


def _forget() -> None:
    _cached.clear()


_double.on_reset(_forget)


def is_lazy() -> bool:
    """Return whether lazy mode is on, deciding once per process like the bridge.

    The first call reads ``PT_HPU_LAZY_MODE`` (default: the release's,
    ``_double.RELEASE_LAZY_DEFAULT``); later calls return that answer even if the
    variable changed.
    """
    _double.record("utils.internal.is_lazy")
    return lazy_mode()


def lazy_mode() -> bool:
    """:func:`is_lazy` without recording a call (for the double's own modules)."""
    if not _cached:
        _cached.append(os.environ.get("PT_HPU_LAZY_MODE", _double.RELEASE_LAZY_DEFAULT) != "0")
    return _cached[0]
