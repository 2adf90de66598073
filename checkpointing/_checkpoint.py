"""``checkpoint``: the drop-in replacement for ``torch.utils.checkpoint.checkpoint``.

Both variants replay the forward's host and device generator states (so dropout masks
are the same), its device and host autocast states, put the recomputation's inputs
behind the backend's recompute barrier (:func:`accel.recompute_barrier`; by default
``backend.mark_step()``, which flushes a lazy device's graph and does nothing
elsewhere), and keep modules with running statistics from updating them a second time.

Reentrant (``use_reentrant=True``; what ``None``, the default, means after the
installed torch's warning, as in torch): an autograd Function
whose backward recomputes and back-propagates with a nested backward call. It needs
at least one tensor input with ``requires_grad=True`` (otherwise it warns and the
parameters inside get no gradient), accepts no keyword arguments for the function,
and does not work with :func:`torch.autograd.grad` or ``backward(inputs=...)``.

Non-reentrant (``use_reentrant=False``): torch's own non-reentrant checkpoint with
accel's generator, autocast, recompute-barrier and running-statistics replay layered in
(see :mod:`checkpointing._non_reentrant` for why); none of those limits, and torch's
``CheckpointError`` when the recomputation does not match the forward.

Under ``torch.compile`` (``torch.compiler.is_compiling()``) both variants call
``torch.utils.checkpoint.checkpoint`` with the caller's arguments: dynamo turns that
call, and only that call, into a checkpointed region of the compiled graph, replaying
randomness itself. ``backend`` is not used there; ``offload_to_cpu`` regions run
eagerly (a graph break), as they cannot be traced.

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

import functools
import os
import sys
import warnings
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch
import torch.utils.checkpoint

from accel import Accelerator, _compat
from accel._compat import (
    CHECKPOINT_TAKES_EARLY_STOP,
    CHECKPOINT_TAKES_RESPECT_HOOKS,
    REENTRANT_OPTIONS_MESSAGE,
)

from ._args import default_backend, require_optional_bool, resolve_backend
from ._non_reentrant import TORCH_CHECKPOINT, TORCH_NOOP_CONTEXT_FN, ContextFn, run_non_reentrant
from ._reentrant import run_reentrant
from ._state import Options

__all__ = ["NO_INPUT_GRAD_WARNING", "checkpoint", "run_checkpoint", "warn_missing_use_reentrant"]

# torch.utils.checkpoint's wording, kept verbatim so filters matching on it keep working.
NO_INPUT_GRAD_WARNING = "None of the inputs have requires_grad=True. Gradients will be None"


def _is_default_context_fn(context_fn: Any) -> bool:
    return context_fn is None or context_fn is TORCH_NOOP_CONTEXT_FN


def checkpoint(
    function: Callable[..., Any] | None = None,
    *args: Any,
    use_reentrant: bool | None = None,
    preserve_rng_state: bool = True,
    backend: Accelerator | str | None = None,
    context_fn: ContextFn | None = None,
    determinism_check: str = "default",
    debug: bool = False,
    early_stop: bool = True,
    respect_saved_tensors_hooks: bool | None = None,
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
        use_reentrant: ``False`` for the non-reentrant variant (recommended),
            ``True`` for the reentrant one. ``None`` (the default) gives the installed
            torch's warning and then the reentrant variant, as torch does.
        preserve_rng_state: Replay the host and device generator states in the
            recomputation, so random ops (dropout) draw the same numbers. ``False``
            saves a little time and makes no generator calls at all.
        backend: The backend or its name; ``None`` means :func:`accel.get_backend`, or,
            for inputs on a device that backend does not compute on, the backend named
            after that device type (one selected by name only, while auto-detection
            keeps cpu).
        context_fn: Non-reentrant only: returns two context managers, entered around
            the forward and around the recomputation (torch's, e.g. from
            ``torch.utils.checkpoint.create_selective_checkpoint_contexts``).
        determinism_check: Non-reentrant only: ``"default"`` checks that the
            recomputation saves tensors of the same shapes, dtypes and devices as the
            forward; ``"none"`` skips the check.
        debug: Non-reentrant only: add torch's operator traces of the forward and the
            recomputation to a mismatch error.
        early_stop: Non-reentrant only: stop recomputing once every tensor backward
            needs is back (torch's ``set_checkpoint_early_stop`` overrides it).
        respect_saved_tensors_hooks: Non-reentrant only: torch's (2.15 and later),
            whether tensors a selective-checkpointing policy saves go through the
            surrounding saved-tensor hooks. ``True`` needs a torch that has it.
        **kwargs: Keyword arguments for ``function`` (non-reentrant only).

    Returns:
        What ``function`` returns; with no ``function`` and no arguments, a decorator
        that checkpoints the function it is given with these options (as torch 2.15's).

    Raises:
        ValueError: Keyword arguments, ``context_fn`` or ``debug`` with the reentrant
            variant, or an unknown ``determinism_check`` (torch's wording).
        TypeError: ``function`` is not callable, or ``backend`` is neither a backend, a
            backend name nor ``None``.
        RuntimeError: In backward, with torch's wording, when the reentrant variant is
            used with :func:`torch.autograd.grad` or ``backward(inputs=...)``, or when
            no recomputed output requires grad.
        torch.utils.checkpoint.CheckpointError: In backward, torch's, when the
            non-reentrant recomputation does not match the forward.
    """
    options: dict[str, Any] = {
        "use_reentrant": use_reentrant,
        "preserve_rng_state": preserve_rng_state,
        "backend": backend,
        "context_fn": context_fn,
        "determinism_check": determinism_check,
        "debug": debug,
        "early_stop": early_stop,
        "respect_saved_tensors_hooks": respect_saved_tensors_hooks,
    }
    if function is None and not args:
        if kwargs:
            raise ValueError("Unexpected keyword arguments: " + ",".join(arg for arg in kwargs))
        return functools.partial(_decorate, options=options)
    if function is None:
        raise TypeError(
            "checkpointing: checkpoint() got arguments but no function to run. Pass the "
            "function first: checkpoint(function, *args, use_reentrant=False)."
        )
    if not callable(function):
        raise TypeError(
            f"checkpointing: checkpoint() runs a function, but its first argument is a "
            f"{type(function).__name__} ({function!r:.60}), which cannot be called. Pass "
            "the function or module first and its inputs after it: "
            "checkpoint(block, x, use_reentrant=False)."
        )
    if torch.compiler.is_compiling():  # torch validates; use_reentrant=None stays torch's
        del options["backend"]
        return _torch_checkpoint(function, args, kwargs, **options)
    require_optional_bool(use_reentrant, "use_reentrant")
    if use_reentrant is None:
        warn_missing_use_reentrant(sequential=False)
    reentrant = True if use_reentrant is None else bool(use_reentrant)
    if kwargs and reentrant:
        raise ValueError("Unexpected keyword arguments: " + ",".join(arg for arg in kwargs))
    if reentrant and (
        not _is_default_context_fn(context_fn)
        or debug is not False
        or (CHECKPOINT_TAKES_RESPECT_HOOKS and respect_saved_tensors_hooks is not None)
    ):
        raise ValueError(REENTRANT_OPTIONS_MESSAGE)
    if respect_saved_tensors_hooks and not CHECKPOINT_TAKES_RESPECT_HOOKS:
        raise ValueError(
            "checkpointing: respect_saved_tensors_hooks=True needs a torch whose checkpoint "
            f"has that argument (torch 2.15 has it; this is torch {torch.__version__}), "
            "where selective checkpointing keeps its saved tensors outside the surrounding "
            "saved-tensor hooks. Upgrade torch, or leave the argument out."
        )
    return run_checkpoint(
        function,
        args,
        kwargs,
        use_reentrant=reentrant,
        preserve_rng_state=preserve_rng_state,
        backend=resolve_backend(backend),
        context_fn=None if _is_default_context_fn(context_fn) else context_fn,
        determinism_check=determinism_check,
        debug=debug,
        early_stop=early_stop,
        respect_saved_tensors_hooks=respect_saved_tensors_hooks,
    )


def _decorate(function: Callable[..., Any], *, options: dict[str, Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def checkpointed(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(function, *args, **options, **kwargs)

    return checkpointed


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


def warn_missing_use_reentrant(*, sequential: bool) -> None:
    """Give the installed torch's warning for a call that does not pass ``use_reentrant``."""
    found = _compat.missing_use_reentrant_warning(sequential)
    if found is not None:
        category, message = found
        warnings.warn(message, category, stacklevel=_user_stacklevel())


def _any_requires_grad(args: tuple[Any, ...]) -> bool:
    return any(isinstance(arg, torch.Tensor) and arg.requires_grad for arg in args)


def _torch_checkpoint(
    function: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    use_reentrant: bool | None,
    preserve_rng_state: bool,
    context_fn: ContextFn | None,
    determinism_check: str,
    debug: bool,
    early_stop: bool,
    respect_saved_tensors_hooks: bool | None,
) -> Any:
    """Call torch's checkpoint under torch.compile, passing only what differs from its defaults.

    Dynamo turns that call into a checkpointed region; it rejects a ``context_fn`` it
    cannot trace even when it is torch's own default, so defaults are left out.
    """
    extra: dict[str, Any] = {}
    if not _is_default_context_fn(context_fn):
        extra["context_fn"] = context_fn
    if determinism_check != "default":
        extra["determinism_check"] = determinism_check
    if debug:
        extra["debug"] = debug
    if not early_stop and CHECKPOINT_TAKES_EARLY_STOP:
        extra["early_stop"] = early_stop
    if respect_saved_tensors_hooks is not None and CHECKPOINT_TAKES_RESPECT_HOOKS:
        extra["respect_saved_tensors_hooks"] = respect_saved_tensors_hooks
    return TORCH_CHECKPOINT(
        function,
        *args,
        use_reentrant=use_reentrant,
        preserve_rng_state=preserve_rng_state,
        **extra,
        **kwargs,
    )


def _run_checkpoint_eagerly(
    function: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    **options: Any,
) -> Any:
    return run_checkpoint(function, args, kwargs, **options)


# Called from a compiled frame, it runs outside dynamo (a graph break), so the eager
# path, with its saved-tensor hooks, does the work.
_run_eagerly: Callable[..., Any] = torch.compiler.disable(_run_checkpoint_eagerly)


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
    debug: bool = False,
    early_stop: bool = True,
    respect_saved_tensors_hooks: bool | None = None,
) -> Any:
    """Checkpoint ``function(*args, **kwargs)`` with validated options.

    The entry point shared by :func:`checkpoint`, ``checkpoint_sequential`` and the
    wrapper; inside ``no_grad`` it is a plain call. Under ``torch.compile`` it calls
    torch's checkpoint (``offload`` regions run eagerly instead).
    """
    if torch.compiler.is_compiling():
        torch_options: dict[str, Any] = {
            "use_reentrant": use_reentrant,
            "preserve_rng_state": preserve_rng_state,
            "context_fn": context_fn,
            "determinism_check": determinism_check,
            "debug": debug,
            "early_stop": early_stop,
            "respect_saved_tensors_hooks": respect_saved_tensors_hooks,
        }
        if offload:
            return _run_eagerly(
                function, args, kwargs, backend=backend, offload=offload, **torch_options
            )
        return _torch_checkpoint(function, args, kwargs, **torch_options)
    if not torch.is_grad_enabled():
        return function(*args, **kwargs)
    if use_reentrant and not _any_requires_grad(args):
        warnings.warn(NO_INPUT_GRAD_WARNING, UserWarning, stacklevel=_user_stacklevel())
    options = Options(
        backend=default_backend((*args, *kwargs.values())) if backend is None else backend,
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
        debug=debug,
        early_stop=early_stop,
        respect_saved_tensors_hooks=respect_saved_tensors_hooks,
    )
