"""Module and tensor hooks that call an offload strategy, holding it strongly or weakly."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Protocol

from torch import nn

__all__ = ["strong_hook", "weak_hook"]


class _RootOwner(Protocol):
    def _root_pre_forward(self, module: nn.Module, args: Any) -> None: ...


def strong_hook(owner: _RootOwner, keep: object) -> Callable[[nn.Module, Any], None]:
    """Return the root's forward pre-hook, which holds ``owner`` and ``keep`` (the handle).

    A plain function: ``copy.deepcopy`` of the model shares it instead of copying the handle.
    """

    def hook(module: nn.Module, args: Any) -> None:
        assert keep is not None  # held here, so that the handle lives as long as the model
        owner._root_pre_forward(module, args)

    return hook


def weak_hook(
    owner: object, method: str, *bound: Any, drop_args: bool = False
) -> Callable[..., None]:
    """Return a hook calling ``owner.method(*args, *bound)`` while ``owner`` is alive."""
    ref = weakref.ref(owner)

    def hook(*args: Any) -> None:
        target = ref()
        if target is not None:
            getattr(target, method)(*(() if drop_args else args), *bound)

    return hook
