"""``checkpoint``: the drop-in replacement for ``torch.utils.checkpoint.checkpoint``.

Both variants replay the forward's host and device generator states (so dropout masks
are the same), its device and host autocast states, call ``backend.mark_step()``
before recomputing (flushing a lazy device's graph; a no-op elsewhere), and keep
modules with running statistics from updating them a second time.

Reentrant (``use_reentrant=True``, the default, as in torch): an autograd Function
whose backward recomputes and back-propagates with a nested backward call. It needs
at least one tensor input with ``requires_grad=True`` (otherwise it warns and the
parameters inside get no gradient), accepts no keyword arguments for the function,
and does not work with :func:`torch.autograd.grad` or ``backward(inputs=...)``.

Non-reentrant (``use_reentrant=False``): saved-tensor hooks on the real graph; none of
those limits, and a clear error when the recomputation does not match the forward.

With ``DistributedDataParallel``, the reentrant variant runs each checkpointed
region's backward inside DDP's own backward, after DDP's graph analysis. It works
with a default DDP when every parameter is used in exactly one checkpointed call per
iteration. When a parameter is used in several checkpointed calls (a module
checkpointed twice, shared weights), or with ``find_unused_parameters=True``, DDP
raises "Expected to mark a variable ready only once"; construct DDP with
``static_graph=True`` for those models (the graph must then be the same every
iteration). The non-reentrant variant needs neither. Nothing here changes DDP's
settings or the variant you chose.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch
import torch.utils.checkpoint

import accel
from accel import Accelerator

from ._non_reentrant import DETERMINISM_CHECKS, ContextFn, run_non_reentrant
from ._reentrant import run_reentrant
from ._state import Options

__all__ = ["NO_INPUT_GRAD_WARNING", "checkpoint", "run_checkpoint"]

# torch.utils.checkpoint's wording, kept verbatim so filters matching on it keep working.
NO_INPUT_GRAD_WARNING = "None of the inputs have requires_grad=True. Gradients will be None"


def _is_default_context_fn(context_fn: Any) -> bool:
    if context_fn is None:
        return True
    torch_default = getattr(torch.utils.checkpoint, "noop_context_fn", None)
    return context_fn is torch_default


def checkpoint(
    function: Callable[..., Any],
    *args: Any,
    use_reentrant: bool | None = True,
    preserve_rng_state: bool = True,
    backend: Accelerator | None = None,
    context_fn: ContextFn | None = None,
    determinism_check: str = "default",
    debug: bool = False,
    early_stop: bool = True,
    **kwargs: Any,
) -> Any:
    """Run ``function`` without keeping its activations; recompute them in backward.

    A drop-in replacement for :func:`torch.utils.checkpoint.checkpoint` that talks to
    the device only through the :class:`accel.Accelerator` protocol, so it gives the
    same outputs and gradients as the plain call on every backend.

    Example::

        from checkpointing import checkpoint

        hidden = checkpoint(block, hidden, use_reentrant=False)

    Args:
        function: What to run; called as ``function(*args, **kwargs)``.
        *args: Its positional arguments (tensors or anything else).
        use_reentrant: ``True`` (default; ``None`` means the same) for the reentrant
            variant, ``False`` for the non-reentrant one; see the module docstring.
        preserve_rng_state: Replay the host and device generator states in the
            recomputation, so random ops (dropout) draw the same numbers. ``False``
            saves a little time and makes no generator calls at all.
        backend: The backend to use; ``None`` means :func:`accel.get_backend`.
        context_fn: Non-reentrant only: returns two context managers, entered around
            the forward and around the recomputation.
        determinism_check: Non-reentrant only: ``"default"`` checks that the
            recomputation saves tensors of the same count, shapes, dtypes and
            devices as the forward; ``"none"`` skips the check.
        debug: Accepted for compatibility; ``True`` is not supported.
        early_stop: Accepted for compatibility and ignored: recomputation always runs
            the whole function, which gives the same tensors.
        **kwargs: Keyword arguments for ``function`` (non-reentrant only).

    Returns:
        What ``function`` returns.

    Raises:
        ValueError: Keyword arguments, ``context_fn`` or ``debug`` with the reentrant
            variant (torch's wording), an unknown ``determinism_check``, or
            ``debug=True``.
        RuntimeError: In backward, with torch's wording, when the reentrant variant is
            used with :func:`torch.autograd.grad` or ``backward(inputs=...)``, or when
            no recomputed output requires grad.
        checkpointing.CheckpointError: In backward, when the non-reentrant
            recomputation does not match the forward.
    """
    del early_stop  # Recomputation always runs to the end; results are the same.
    reentrant = True if use_reentrant is None else bool(use_reentrant)
    if kwargs and reentrant:
        raise ValueError("Unexpected keyword arguments: " + ",".join(arg for arg in kwargs))
    if reentrant and (not _is_default_context_fn(context_fn) or debug):
        raise ValueError(
            "Passing `context_fn` or `debug` is only supported when use_reentrant=False."
        )
    if debug:
        raise ValueError(
            "checkpointing: debug=True (operator traces of a mismatching recomputation) is "
            "not supported; the mismatch error already names the saved tensor's position, "
            "shape, dtype and device. Remove debug=True."
        )
    if determinism_check not in DETERMINISM_CHECKS:
        raise ValueError(
            f"determinism_check should be one of {list(DETERMINISM_CHECKS)}, "
            f"but got {determinism_check}"
        )
    return run_checkpoint(
        function,
        args,
        kwargs,
        use_reentrant=reentrant,
        preserve_rng_state=preserve_rng_state,
        backend=backend,
        context_fn=None if _is_default_context_fn(context_fn) else context_fn,
        determinism_check=determinism_check,
    )


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))


def _user_stacklevel() -> int:
    """Return the ``stacklevel`` of the first caller outside this package and torch.

    ``Module.__call__`` sits between a wrapper's forward and its user, so a fixed
    level would point warnings into torch.
    """
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if not filename.startswith((_PACKAGE_DIR, _TORCH_DIR)):
            return level
        frame = frame.f_back
        level += 1
    return 1


def _any_requires_grad(args: tuple[Any, ...]) -> bool:
    return any(isinstance(arg, torch.Tensor) and arg.requires_grad for arg in args)


def run_checkpoint(
    function: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    use_reentrant: bool,
    preserve_rng_state: bool = True,
    backend: Accelerator | None = None,
    offload: bool = False,
    context_fn: ContextFn | None = None,
    determinism_check: str = "default",
) -> Any:
    """Checkpoint ``function(*args, **kwargs)`` with validated options.

    The entry point shared by :func:`checkpoint`, ``checkpoint_sequential`` and the
    wrapper; inside ``no_grad`` it is a plain call.
    """
    if not torch.is_grad_enabled():
        return function(*args, **kwargs)
    if use_reentrant and not _any_requires_grad(args):
        warnings.warn(NO_INPUT_GRAD_WARNING, UserWarning, stacklevel=_user_stacklevel())
    options = Options(
        backend=accel.get_backend() if backend is None else backend,
        preserve_rng_state=preserve_rng_state,
        offload=offload,
    )
    if use_reentrant:
        if kwargs:
            raise ValueError("Unexpected keyword arguments: " + ",".join(kwargs))
        return run_reentrant(function, args, options)
    return run_non_reentrant(
        function,
        args,
        kwargs,
        options,
        context_fn=context_fn,
        determinism_check=determinism_check,
    )
