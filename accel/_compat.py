"""Differences between the torch releases accel supports (2.4 to 2.15), one function each.

Algorithms call these instead of testing ``torch.__version__`` themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["SAVED_TENSORS_HOOKS_VISIBLE", "current_saved_tensors_hooks"]

# torch 2.4 has no way to read the innermost saved_tensors_hooks from Python; torch 2.5
# added torch._C._autograd._top_saved_tensors_default_hooks (present through 2.15).
_top_hooks: Callable[[bool], Any] | None = getattr(
    torch._C._autograd, "_top_saved_tensors_default_hooks", None
)
SAVED_TENSORS_HOOKS_VISIBLE = _top_hooks is not None


def current_saved_tensors_hooks() -> tuple[Callable[..., Any], Callable[..., Any]] | None:
    """Return the innermost active ``(pack, unpack)`` saved-tensor hooks, or ``None``.

    Always ``None`` on torch 2.4, which cannot report them
    (:data:`SAVED_TENSORS_HOOKS_VISIBLE` is then false).
    """
    if _top_hooks is None:
        return None
    hooks = _top_hooks(False)
    return None if hooks is None else (hooks[0], hooks[1])
