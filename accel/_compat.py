"""Where torch's API or behaviour differs between the supported releases (2.4 to 2.15).

One small function or constant per difference, each with the release that changed
it, so that no algorithm carries a version check of its own. Importing this module
imports torch; ``import accel`` does not import it.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.utils.checkpoint

__all__ = [
    "CHECKPOINT_TAKES_EARLY_STOP",
    "CHECKPOINT_TAKES_RESPECT_HOOKS",
    "REENTRANT_OPTIONS_MESSAGE",
    "checkpoint_debug_leaks_on_error",
    "checkpoint_early_stop",
    "checkpoint_supports_vmap",
    "graph_exec_group",
    "missing_use_reentrant_warning",
]


def checkpoint_supports_vmap() -> bool:
    """Whether ``torch.func.vmap`` works over torch's non-reentrant checkpoint.

    Up to torch 2.4.1 (and later releases that still save a checkpoint's inputs
    through the ``_NoopSaveInputs`` autograd Function), vmap raises "You tried to
    vmap over _NoopSaveInputs, but it does not have vmap support". pytorch#174327
    (present in 2.13 and 2.15) saves them through ``torch._C._autograd._make_saved_tensor``
    instead, which vmap passes through.
    """
    return hasattr(torch._C._autograd, "_make_saved_tensor")


#: Whether ``torch.utils.checkpoint.checkpoint`` takes ``early_stop`` (not in 2.4.1; in 2.13).
#: Read once at import: under torch.compile, dynamo cannot trace inspect.signature of
#: torch's checkpoint (a higher-order op there).
CHECKPOINT_TAKES_EARLY_STOP = (
    "early_stop" in inspect.signature(torch.utils.checkpoint.checkpoint).parameters
)


#: Whether torch's checkpoint takes ``respect_saved_tensors_hooks`` (new in 2.15; not in
#: 2.13 or 2.4.1).
CHECKPOINT_TAKES_RESPECT_HOOKS = (
    "respect_saved_tensors_hooks" in inspect.signature(torch.utils.checkpoint.checkpoint).parameters
)

#: torch's error for non-reentrant-only options given to the reentrant variant; 2.15 added
#: ``respect_saved_tensors_hooks`` to the list and to the message.
REENTRANT_OPTIONS_MESSAGE = (
    "Passing `context_fn`, `debug`, or `respect_saved_tensors_hooks` is only supported "
    "when use_reentrant=False."
    if CHECKPOINT_TAKES_RESPECT_HOOKS
    else "Passing `context_fn` or `debug` is only supported when use_reentrant=False."
)


def checkpoint_early_stop(early_stop: bool) -> tuple[dict[str, Any], AbstractContextManager[Any]]:
    """Return how to pass ``early_stop`` to ``torch.utils.checkpoint.checkpoint``.

    torch 2.4.1's ``checkpoint`` has no ``early_stop`` argument, only the global
    ``set_checkpoint_early_stop`` (on by default); 2.13 and 2.15 take the argument,
    which the global switch overrides when it is set. On a torch without the
    argument, ``early_stop=False`` becomes ``set_checkpoint_early_stop(False)`` around
    the call (read when the forward runs), and ``True`` leaves the global switch alone.

    Returns:
        Keyword arguments for torch's ``checkpoint``, and a context to call it in.
    """
    if CHECKPOINT_TAKES_EARLY_STOP:
        return {"early_stop": early_stop}, nullcontext()
    if early_stop:
        return {}, nullcontext()
    return {}, torch.utils.checkpoint.set_checkpoint_early_stop(False)


def _release() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


def checkpoint_debug_leaks_on_error() -> bool:
    """Whether torch's ``debug=True`` checkpoint leaves its logging mode behind on an error.

    In torch 2.4.1, when a debug-mode recomputation raises, the forward's operator
    logging (a dispatch mode and a logging handler) stays installed, so later code in
    the process logs every operator and fails ("trying to pop from empty mode stack");
    torch's own checkpoint does it too. 2.13 and 2.15 clean up. The release in between
    that fixed it is not pinned down, so every release before 2.13 counts as leaking.
    """
    return _release() < (2, 13)


def graph_exec_group() -> Any:
    """Return ``torch.utils.checkpoint.GraphExecGroup``, or ``None`` where it does not exist.

    Absent from torch 2.4.1; present in 2.13 and 2.15.
    """
    return getattr(torch.utils.checkpoint, "GraphExecGroup", None)


# Bound at import, so that a later global rebinding of torch's names to accel's does not
# turn the probe below into a call of accel's own checkpoint.
_TORCH_CHECKPOINT = torch.utils.checkpoint.checkpoint
_TORCH_CHECKPOINT_SEQUENTIAL = torch.utils.checkpoint.checkpoint_sequential


def _identity(value: torch.Tensor) -> torch.Tensor:
    return value


@functools.cache
def missing_use_reentrant_warning(sequential: bool) -> tuple[type[Warning], str] | None:
    """Return the warning the installed torch gives when ``use_reentrant`` is not passed.

    torch warns and then uses the reentrant variant, with a wording that changed
    between releases (2.4.1: "In version 2.4 we will raise an exception...", 2.13:
    "Starting in PyTorch 2.9, calling checkpoint without use_reentrant will raise an
    exception...", 2.15: "In a future release..."). It is read from the installed
    torch once, by calling its ``checkpoint`` (``checkpoint_sequential`` when
    ``sequential``) on a scalar without grad, so that ours says exactly what torch
    says.

    Returns:
        The warning's category and text, or ``None`` if this torch does not warn.
    """
    value = torch.zeros(())
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        if sequential:
            _TORCH_CHECKPOINT_SEQUENTIAL([_identity], 1, value)  # type: ignore[no-untyped-call]
        else:
            _TORCH_CHECKPOINT(_identity, value)
    for warning in caught:
        if "use_reentrant" in str(warning.message):
            return warning.category, str(warning.message)
    return None
