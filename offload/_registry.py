"""Which models have their parameters offloaded by :func:`offload.offload_parameters`."""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING

from torch import nn

if TYPE_CHECKING:
    from ._handle import ParameterOffload

__all__ = ["ACTIVE", "ACTIVE_LOCK", "active_offloads", "offloaded_roots"]

# Model -> its handle, both weak: the model keeps its handle alive through its hooks, and
# a model dropped without remove() must not be kept alive by this registry.
ACTIVE: weakref.WeakKeyDictionary[nn.Module, weakref.ref[ParameterOffload]] = (
    weakref.WeakKeyDictionary()
)
ACTIVE_LOCK = threading.Lock()


def active_offloads(module: nn.Module) -> list[ParameterOffload]:
    """Return the parameter offloads installed on ``module`` or any of its submodules."""
    with ACTIVE_LOCK:
        refs = [ACTIVE.get(m) for m in module.modules()]
    handles = [ref() for ref in refs if ref is not None]
    return [handle for handle in handles if handle is not None]


def offloaded_roots() -> list[nn.Module]:
    """Return every model whose parameters are offloaded now."""
    with ACTIVE_LOCK:
        return list(ACTIVE.keys())
