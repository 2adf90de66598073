"""Checkpointing one module: ``CheckpointWrapper`` and ``checkpoint_wrapper``.

:class:`CheckpointWrapper` runs its module's forward through the checkpoint. It keeps
the wrapped module's parameters, buffers and ``state_dict`` keys (the wrapper adds no
prefix to saved or loaded state dicts), forwards attribute reads to the wrapped
module, and can keep the checkpointed inputs in host memory between forward and
backward (``offload_to_cpu``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import accel
from accel import Accelerator

from ._args import require_bool, resolve_backend
from ._caches import refuse_cache_arguments
from ._checkpoint import run_checkpoint
from ._state_dict import keep_plain_keys

__all__ = ["CheckpointWrapper", "checkpoint_wrapper"]

_WRAPPED = "_checkpoint_wrapped_module"


class _BackendRef:
    """The wrapper's backend: shared by copies, stored by name when pickled.

    Backends hold process-wide handles (vendor modules, streams) that cannot be
    copied or pickled, so ``copy.deepcopy`` of a wrapped model shares the backend and
    pickling stores its name, resolved again with :func:`accel.get_backend` on first use.
    """

    def __init__(self, backend: Accelerator | None = None, name: str | None = None) -> None:
        self._backend = backend
        self._name = name

    def get(self) -> Accelerator | None:
        if self._backend is None and self._name is not None:
            self._backend = accel.get_backend(self._name)
        return self._backend

    def __deepcopy__(self, memo: dict[int, Any]) -> _BackendRef:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        name = self._name if self._backend is None else self._backend.name
        return (_BackendRef, (None, name))


class CheckpointWrapper(nn.Module):
    """Runs ``module`` through :func:`checkpointing.checkpoint`.

    Build it with :func:`checkpoint_wrapper`. ``state_dict()`` has the wrapped
    module's keys, and ``load_state_dict`` accepts them; attributes the wrapper does
    not have are read from the wrapped module.

    Args:
        module: The module to checkpoint.
        offload_to_cpu: Keep the checkpointed inputs in host memory between forward
            and backward (see :func:`checkpoint_wrapper`).
        use_reentrant: Which checkpoint variant to use.
        preserve_rng_state: Replay the generator states in recomputation.
        backend: The backend or its name; ``None`` means :func:`accel.get_backend` at
            each call.
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        offload_to_cpu: bool = False,
        use_reentrant: bool = False,
        preserve_rng_state: bool = True,
        backend: Accelerator | str | None = None,
    ) -> None:
        _check_module(module)
        super().__init__()
        self._checkpoint_wrapped_module = module
        self.offload_to_cpu = require_bool(offload_to_cpu, "offload_to_cpu")
        self.use_reentrant = require_bool(use_reentrant, "use_reentrant")
        self.preserve_rng_state = require_bool(preserve_rng_state, "preserve_rng_state")
        self._backend_ref = _BackendRef(resolve_backend(backend))
        self._traced = dynamo_traces(module)
        keep_plain_keys(self, _WRAPPED)

    @property
    def module(self) -> nn.Module:
        """The wrapped module."""
        wrapped: nn.Module = self._modules[_WRAPPED]  # type: ignore[assignment]
        return wrapped

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == _WRAPPED or _WRAPPED not in self.__dict__.get("_modules", {}):
                raise
            return getattr(self._modules[_WRAPPED], name)

    def __getitem__(self, index: Any) -> Any:
        indexable: Any = self.module
        return indexable[index]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the wrapped module's forward as a checkpoint."""
        if torch.compiler.is_compiling() and not self._traced:
            return self._outside_graph(*args, **kwargs)
        module = self.module
        if torch.is_grad_enabled():
            refuse_cache_arguments(module, args, kwargs)
        function: Callable[..., Any] = module
        if kwargs and self.use_reentrant:
            function, args = _flatten_kwargs(module, args, kwargs)
            kwargs = {}
        return run_checkpoint(
            function,
            args,
            kwargs,
            use_reentrant=self.use_reentrant,
            preserve_rng_state=self.preserve_rng_state,
            backend=self._backend_ref.get(),
            offload=self.offload_to_cpu,
        )

    # Dynamo breaks the graph at the first touch of a module it cannot trace (an RNN),
    # so the wrapper hands the call over before reading its module.
    @torch.compiler.disable  # type: ignore[untyped-decorator]
    def _outside_graph(self, *args: Any, **kwargs: Any) -> Any:
        """This wrapper's forward, run eagerly from a compiled frame (:func:`dynamo_traces`)."""
        return self.forward(*args, **kwargs)

    def extra_repr(self) -> str:
        variant = "reentrant" if self.use_reentrant else "non-reentrant"
        return f"{variant}, offload_to_cpu={self.offload_to_cpu}"


def _flatten_kwargs(
    module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """Pass keyword arguments positionally, for the reentrant variant that takes none."""
    keys = list(kwargs)
    positional = len(args)

    def call(*values: Any) -> Any:
        return module(*values[:positional], **dict(zip(keys, values[positional:], strict=True)))

    return call, (*args, *kwargs.values())


def dynamo_traces(module: nn.Module) -> bool:
    """Whether torch.compile can trace ``module`` inside a checkpointed region.

    Dynamo refuses an RNN there (``nn.LSTM``, ``nn.GRU``, ``nn.RNN``; its
    ``allow_rnn`` setting, off by default, lifts that), breaking the graph in every
    frame on the way, and runs a plain model holding one eagerly. A wrapper around such
    a module runs eagerly too (``_outside_graph``), adding no graph break.
    """
    config = sys.modules.get("torch._dynamo.config")
    if getattr(config, "allow_rnn", False):
        return True
    return not any(isinstance(inner, nn.RNNBase) for inner in module.modules())


def _check_module(module: object) -> None:
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"checkpointing: checkpoint_wrapper expects the torch.nn.Module to checkpoint, "
            f"got {module!r} ({type(module).__name__}). Pass a module; to checkpoint a plain "
            "function or callable, call checkpointing.checkpoint(function, *args) instead."
        )


def checkpoint_wrapper(
    module: nn.Module,
    offload_to_cpu: bool = False,
    *,
    use_reentrant: bool = False,
    preserve_rng_state: bool = True,
    backend: Accelerator | str | None = None,
) -> CheckpointWrapper:
    """Wrap ``module`` so that its forward is checkpointed.

    The wrapper defaults to the non-reentrant variant, which takes keyword
    arguments and gives parameters gradients even when no input requires grad (the
    first block of a model usually receives data). Pass ``use_reentrant=True`` for
    the reentrant one.

    Example::

        from checkpointing import checkpoint_wrapper

        model.blocks[0] = checkpoint_wrapper(model.blocks[0], offload_to_cpu=True)

    Args:
        module: The module to wrap. Its parameters stay the same objects.
        offload_to_cpu: Keep the checkpointed inputs in host memory between forward
            and backward: copied to pinned memory on a side stream where the backend
            supports them, and back to their device, with their ``requires_grad``,
            for the recomputation. Inputs already in host memory are not copied.
        use_reentrant: Use the reentrant variant (default ``False``).
        preserve_rng_state: Replay the generator states in recomputation.
        backend: The backend or its name; ``None`` means :func:`accel.get_backend` at
            each call.

    Returns:
        The wrapper, to put in ``module``'s place.

    Raises:
        ValueError: If ``module`` is already a :class:`CheckpointWrapper`.
        TypeError: If ``module`` is not an :class:`torch.nn.Module`, a flag is not a
            bool, or ``backend`` is neither a backend, a name nor ``None``.
    """
    _check_module(module)
    if isinstance(module, CheckpointWrapper):
        raise ValueError(
            "checkpointing: this module is already a CheckpointWrapper; checkpointing it "
            "twice would recompute it twice. Wrap the inner module (wrapper.module) or "
            "keep the existing wrapper."
        )
    return CheckpointWrapper(
        module,
        offload_to_cpu=offload_to_cpu,
        use_reentrant=use_reentrant,
        preserve_rng_state=preserve_rng_state,
        backend=backend,
    )
