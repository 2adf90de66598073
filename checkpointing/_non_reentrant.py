"""The non-reentrant checkpoint: torch's own, with accel's state replay layered in.

Design. This variant runs torch's public
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`` and adds what only
the :class:`accel.Accelerator` protocol knows, instead of re-implementing torch's
saved-tensor machinery. That machinery is where torch's contract lives and where it
changes between releases: early stop (and ``set_checkpoint_early_stop``), the
``debug=True`` operator traces (and ``set_checkpoint_debug_enabled``), the exact
``CheckpointError`` texts for a recomputation that differs from the forward and for a
saved tensor unpacked twice, ``torch.autograd.grad`` inside the checkpointed function,
``GraphExecGroup``, nested checkpoints, and ``torch.func.vmap``. A copy of it has to
follow every release (the copy this replaces read its saved inputs in a way that
failed on every torch before 2.13); delegating gives each installed torch's behaviour,
word for word, for free.

What accel adds, through the protocol, is layered around the user's function rather
than through ``context_fn``, so ``context_fn`` stays the user's (selective
checkpointing policies from ``create_selective_checkpoint_contexts``) and
``debug=True``, which torch only allows with the default ``context_fn``, keeps working:

* torch is called with ``preserve_rng_state=False`` and the function it runs is a
  :class:`_Replay`. Its first call is the forward: it captures the host generator and
  the generator of every device the inputs live on (``backend.get_rng_state(index)``),
  and the autocast states (``backend.autocast_kwargs()``). Each later call is a
  recomputation: it puts its inputs behind the recompute barrier
  (:func:`accel.recompute_barrier`), enters
  ``backend.fork_rng(devices=...)``, restores those generators, replays the autocast
  states, marks the thread as recomputing, and keeps modules with running statistics
  from updating them twice (:func:`checkpointing._state.recomputation`). torch's own
  generator handling would only know the devices torch has a module for, and no
  recompute barrier.
* ``offload_to_cpu`` is a saved-tensor hook around torch's call: torch saves the
  checkpoint's inputs before installing its own hooks, so exactly those inputs pass
  through ours, which keeps them in host memory until the recomputation reads them.

Devices torch has no module for. torch's checkpoint looks up ``torch.<device type>``
for the device its tensor arguments live on, and raises ``AttributeError`` where there
is none (a lazy-tensor runtime that registers no device module of its own). Such
arguments reach torch inside an opaque :class:`_Hidden` box, so torch infers its
default device type and treats the box as a plain object; :class:`_Replay` opens the
box for the function. torch then does not save those tensors: the box keeps them for
the recomputation (as torch's saved input would), or, with ``offload_to_cpu``, keeps
only their host copy. Nothing in torch is patched.

Under ``torch.compile``, dynamo only understands torch's checkpoint itself (it becomes
a higher-order op, and dynamo enters no custom context), so :mod:`._checkpoint`
delegates there with the user's own arguments and nothing of ours.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.utils.checkpoint

from accel import _compat

from ._offload import HostCopy, restore, stash, wait_for_copies
from ._state import ForwardState, Options, recomputation

__all__ = ["TORCH_CHECKPOINT", "TORCH_NOOP_CONTEXT_FN", "ContextFn", "run_non_reentrant"]

ContextFn = Callable[[], tuple[AbstractContextManager[Any], AbstractContextManager[Any]]]

# torch's own function, bound at import: code that rebinds torch.utils.checkpoint.checkpoint
# to ours (a global patch, as some libraries do) must not make ours call itself.
TORCH_CHECKPOINT: Callable[..., Any] = torch.utils.checkpoint.checkpoint
TORCH_NOOP_CONTEXT_FN = torch.utils.checkpoint.noop_context_fn


class _Hidden:
    """A tensor argument passed to torch's checkpoint where torch cannot see it.

    Holds the tensor for the forward and, for the recomputation, either the tensor
    again or only its host copy (``offload_to_cpu``), which is restored to the device
    when the recomputation opens the box.
    """

    __slots__ = ("host", "tensor")

    def __init__(self, tensor: torch.Tensor, host: HostCopy | None) -> None:
        self.tensor: torch.Tensor | None = tensor
        self.host = host

    def open(self, options: Options) -> torch.Tensor:
        if self.tensor is not None:
            return self.tensor
        assert self.host is not None
        return restore(self.host, options.backend)

    def forward_done(self) -> None:
        """Drop the device tensor where a host copy keeps its values until backward."""
        if self.host is not None:
            self.tensor = None


def _opened(args: tuple[Any, ...], options: Options) -> tuple[Any, ...]:
    return tuple(arg.open(options) if isinstance(arg, _Hidden) else arg for arg in args)


class _Replay:
    """What torch's checkpoint runs: the forward on the first call, recomputations after."""

    def __init__(self, function: Callable[..., Any], options: Options) -> None:
        self.function = function
        self.options = options
        self.state: ForwardState | None = None
        self.aliases: tuple[tuple[int, int], ...] = ()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        state = self.state
        args = _opened(args, self.options)
        if state is None:
            self.aliases = _aliases((*args, *kwargs.values()))
            state = self.state = ForwardState.capture(
                self.options.backend,
                self.options.preserve_rng_state,
                (*args, *kwargs.values()),
            )
            try:
                return self.function(*args, **kwargs)
            except BaseException:
                state.restore_rng()
                raise
        if self.aliases:
            args, kwargs = _realiased(args, kwargs, self.aliases)
        with recomputation(state, (*args, *kwargs.values())):
            return self.function(*args, **kwargs)


def _aliases(values: tuple[Any, ...]) -> tuple[tuple[int, int], ...]:
    """``(later, first)`` positions of tensors passed more than once (``attn(x, x, x)``)."""
    first: dict[int, int] = {}
    pairs = []
    for position, value in enumerate(values):
        if isinstance(value, torch.Tensor):
            pairs.extend([(position, first[id(value)])] if id(value) in first else [])
            first.setdefault(id(value), position)
    return tuple(pairs)


def _realiased(
    args: tuple[Any, ...], kwargs: dict[str, Any], aliases: tuple[tuple[int, int], ...]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The recomputation's arguments with the forward's repeats restored.

    torch hands the recomputation one tensor per saved argument, so ``f(x, x)`` would
    be recomputed as ``f(x1, x2)``; a module that tells the two apart (self-attention
    projects ``query is key`` in one product) would run differently.
    """
    values = [*args, *kwargs.values()]
    for later, first in aliases:
        values[later] = values[first]
    count = len(args)
    return tuple(values[:count]), dict(zip(kwargs, values[count:], strict=True))


def _hide_unknown_devices(args: tuple[Any, ...], options: Options) -> tuple[Any, ...]:
    """Box the tensors on devices torch's checkpoint has no module for (see module doc)."""
    if all(
        not isinstance(arg, torch.Tensor) or _compat.checkpoint_knows_device(arg.device.type)
        for arg in args
    ):
        return args
    hidden: list[Any] = []
    for arg in args:
        if isinstance(arg, torch.Tensor) and not _compat.checkpoint_knows_device(arg.device.type):
            item = stash(arg, options.backend) if options.offload else arg
            hidden.append(_Hidden(arg, item if isinstance(item, HostCopy) else None))
        else:
            hidden.append(arg)
    return tuple(hidden)


class _OffloadInputs(torch.autograd.graph.saved_tensors_hooks):
    """Keeps the checkpoint's saved inputs in host memory until the recomputation."""

    def __init__(self, options: Options) -> None:
        backend = options.backend
        self.copies: list[HostCopy] = []

        def pack(tensor: torch.Tensor) -> torch.Tensor | HostCopy:
            item = stash(tensor, backend)
            if isinstance(item, HostCopy):
                self.copies.append(item)
            return item

        def unpack(item: torch.Tensor | HostCopy) -> torch.Tensor:
            return restore(item, backend)

        super().__init__(pack, unpack)


def _on_device(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return any(
        isinstance(value, torch.Tensor) and value.device.type != "cpu"
        for value in (*args, *kwargs.values())
    )


def run_non_reentrant(
    function: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    options: Options,
    *,
    context_fn: ContextFn | None = None,
    determinism_check: str = "default",
    debug: bool = False,
    early_stop: bool = True,
    respect_saved_tensors_hooks: bool | None = None,
) -> Any:
    """Run ``function(*args, **kwargs)`` through torch's non-reentrant checkpoint.

    Args:
        function: The function to checkpoint.
        args: Its positional arguments.
        kwargs: Its keyword arguments.
        options: Backend, RNG and offload settings.
        context_fn: torch's ``context_fn``; ``None`` means torch's default.
        determinism_check: torch's ``determinism_check``.
        debug: torch's ``debug``.
        early_stop: torch's ``early_stop``.
        respect_saved_tensors_hooks: torch's (2.15 and later); ``None`` passes nothing.

    Returns:
        What ``function`` returns.
    """
    if not torch.is_grad_enabled():
        return function(*args, **kwargs)
    replay = _Replay(function, options)
    args = _hide_unknown_devices(args, options)
    # Host inputs are never copied, so without a device input there is nothing to offload
    # (and the inputs come back to the recomputation as the same objects).
    offload = _OffloadInputs(options) if options.offload and _on_device(args, kwargs) else None
    early_stop_kwargs, early_stop_context = _compat.checkpoint_early_stop(early_stop)
    if respect_saved_tensors_hooks is not None and _compat.CHECKPOINT_TAKES_RESPECT_HOOKS:
        early_stop_kwargs["respect_saved_tensors_hooks"] = respect_saved_tensors_hooks
    try:
        with offload if offload is not None else nullcontext(), early_stop_context:
            return TORCH_CHECKPOINT(
                replay,
                *args,
                use_reentrant=False,
                preserve_rng_state=False,
                context_fn=TORCH_NOOP_CONTEXT_FN if context_fn is None else context_fn,
                determinism_check=determinism_check,
                debug=debug,
                **early_stop_kwargs,
                **kwargs,
            )
    finally:
        boxes = [arg for arg in args if isinstance(arg, _Hidden)]
        copies = [box.host for box in boxes if box.host is not None]
        if offload is not None:
            copies.extend(offload.copies)
        wait_for_copies(copies, options.backend)
        for box in boxes:
            box.forward_done()
