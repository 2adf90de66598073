"""Differences between the torch releases accel supports (2.4 to 2.15), in one place.

Each entry names the release that changed what it papers over. Code elsewhere imports
from here instead of comparing version numbers, so an old release can be dropped by
deleting its entry. This module imports torch: only modules that already need torch
import it (``import accel`` does not).

Not differences, kept here so nobody re-adds a version check for them:

- ``checkpointing``'s non-reentrant checkpoint keeps its input saver's *output* alive,
  not only the saver's node: before torch 2.13 a custom Function's node frees its saved
  tensors once its last output is collected ("Trying to backward through the graph a
  second time" when they are read). Keeping the output works on every release.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, cast

import torch

__all__ = [
    "FSDP2_MIN_RELEASE_OFF_CUDA",
    "SAVED_TENSORS_HOOKS_VISIBLE",
    "current_saved_tensors_hooks",
    "fsdp2_fully_shard",
    "torch_release",
]


def torch_release() -> tuple[int, int]:
    """Return the installed torch's (major, minor), e.g. ``(2, 4)`` for ``2.4.1+cu121``."""
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


# FSDP2 off CUDA: torch 2.4 and 2.5 create torch.cuda streams whatever the mesh's device
# ("CUDA driver version is insufficient" on a gloo/CPU mesh); 2.6 takes the mesh's device,
# but its CPU stream lacks record_event ("'Stream' object has no attribute 'record_event'"),
# which pytorch/pytorch#145935 added for 2.7. Seen failing here with 2.4.1 and 2.6.0,
# passing with 2.13.0 and 2.15.0.
FSDP2_MIN_RELEASE_OFF_CUDA = (2, 7)

# torch 2.6 made FSDP2 public as torch.distributed.fsdp.fully_shard; 2.4 and 2.5 ship the
# same function as torch.distributed._composable.fsdp.fully_shard.
_FULLY_SHARD_MODULES = ("torch.distributed.fsdp", "torch.distributed._composable.fsdp")


def fsdp2_fully_shard() -> Callable[..., Any]:
    """Return FSDP2's ``fully_shard`` from wherever this torch release keeps it.

    Raises:
        ImportError: This torch build has no FSDP2 (built without distributed support).
    """
    for module_name in _FULLY_SHARD_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        function = getattr(module, "fully_shard", None)
        if callable(function):
            return cast("Callable[..., Any]", function)
    raise ImportError(
        f"torch {torch.__version__} has no FSDP2 fully_shard (looked in "
        f"{' and '.join(_FULLY_SHARD_MODULES)}): it needs torch 2.4 or newer built with "
        "distributed support (torch.distributed.is_available()). Install such a build, "
        "or use DistributedDataParallel."
    )


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
