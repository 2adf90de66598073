"""Double of ``habana_frameworks.torch.utils.internal``."""

from __future__ import annotations

import os

from habana_frameworks import _double

__all__ = ["is_lazy"]


def is_lazy() -> bool:
    """Return whether lazy mode is on: ``PT_HPU_LAZY_MODE``, default off (eager)."""
    _double.record("utils.internal.is_lazy")
    return os.environ.get("PT_HPU_LAZY_MODE", "0") != "0"
