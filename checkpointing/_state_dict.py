"""Wrappers that keep the wrapped model's ``state_dict`` keys.

A wrapper module that holds the real model as a child (``self.<attribute>``) would add
``<attribute>.`` to every key; these hooks take it out when saving and put it back when
loading, so checkpoints move between the wrapped and the plain model. Keys saved with
the prefix (by older versions) still load.
"""

from __future__ import annotations

import functools
from typing import Any

from torch import nn

__all__ = ["keep_plain_keys"]


def _strip(
    inner: str, module: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any
) -> dict[str, Any]:
    wrapped = prefix + inner
    for key in [key for key in state_dict if key.startswith(wrapped)]:
        state_dict[prefix + key[len(wrapped) :]] = state_dict.pop(key)
    return state_dict


def _add(
    inner: str,
    module: nn.Module,
    state_dict: dict[str, Any],
    prefix: str,
    *args: Any,
) -> None:
    wrapped = prefix + inner
    for key in [key for key in state_dict if key.startswith(prefix)]:
        if not key.startswith(wrapped):
            state_dict[wrapped + key[len(prefix) :]] = state_dict.pop(key)


def keep_plain_keys(wrapper: nn.Module, attribute: str) -> None:
    """Make ``wrapper``'s ``state_dict`` keys those of its child ``attribute``'s model.

    Args:
        wrapper: The wrapper module, changed in place (two hooks registered).
        attribute: The name of the child that holds the wrapped model.
    """
    inner = attribute + "."
    wrapper._register_state_dict_hook(functools.partial(_strip, inner))
    wrapper._register_load_state_dict_pre_hook(functools.partial(_add, inner), with_module=True)
