"""Operator-grain checkpointing: keep some operators' outputs, recompute the rest.

Inside a checkpointed module, a selective policy (torch's
``create_selective_checkpoint_contexts``, passed as ``context_fn``) keeps the outputs
of some operators and lets everything else be recomputed in backward. Two policies:

* by operator class (:func:`selective_context_fn`): keep matrix products,
  convolutions and attention; recompute pointwise activations, dropout,
  normalisation, softmax and reshapes. With ``every_second_mm``, torchtitan's rule:
  the 2nd, 4th, ... ``aten.mm`` of each module call is recomputed too
  (:func:`alternated`);
* by chosen call (:func:`kept_calls_context_fn`): keep exactly the calls the
  planner chose from a profiled step (:mod:`._kept_ops`), named by operator and
  occurrence. In the forward a guard checks the rules that keep the recomputation
  exact (in-place writes stay inside kept units; random draws are kept as a suffix)
  and raises :class:`CheckpointError` if the module's operators no longer match.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from accel._compat import (
    keep_selective_cache_outside_hooks,
    selective_checkpoint_api,
    selective_contexts,
)

from ._errors import CheckpointError, plan_mismatch
from ._measure import storage_key
from ._non_reentrant import ContextFn

__all__ = [
    "ALTERNATED_OPERATOR",
    "SAVED_OPERATORS",
    "alternated",
    "is_saved_operator",
    "kept_calls_context_fn",
    "operator_class_contexts",
    "selective_context_fn",
    "unavailable_reason",
    "written_tensors",
]


def written_tensors(func: Any, args: Any, kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensor arguments the aten operator ``func`` writes in place (its schema's ``a!``).

    Version counters cannot tell inside a dispatch mode: autograd increments them above it.
    """
    written: list[torch.Tensor] = []
    for position, name in _written_arguments(func):
        value = args[position] if position < len(args) else kwargs.get(name)
        values = value if isinstance(value, list | tuple) else [value]
        written.extend(item for item in values if isinstance(item, torch.Tensor))
    return written


# Per-overload facts the forward guard asks of every operator call, read once: parsing a
# schema's arguments on each call cost more than most small operators themselves.
@cache
def _written_arguments(func: Any) -> tuple[tuple[int, str], ...]:
    """``(position, name)`` of each argument the overload ``func`` writes in place."""
    return tuple(
        (position, argument.name)
        for position, argument in enumerate(func._schema.arguments)
        if argument.alias_info is not None and argument.alias_info.is_write
    )


@cache
def _draws(func: Any) -> bool:
    """Whether the overload ``func`` draws random numbers (tagged ``nondeterministic_seeded``)."""
    return torch.Tag.nondeterministic_seeded in func.tags


def _overloads(*names: str) -> frozenset[Any]:
    found: list[Any] = []
    for name in names:
        packet = getattr(torch.ops.aten, name, None)
        if packet is not None:
            found.extend(getattr(packet, overload) for overload in packet.overloads())
    return frozenset(found)


SAVED_OPERATORS = _overloads(
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "convolution",
    "_convolution",
    "_scaled_mm",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_efficient_attention_forward",
    "_flash_attention_forward",
)
"""The aten operators whose outputs a selective checkpoint keeps."""


ALTERNATED_OPERATOR = "aten.mm.default"
"""The operator of which ``every_second_mm`` recomputes every second call (a bias-free
``nn.Linear``'s product; ``addmm`` and batched products stay kept, as in torchtitan)."""


def is_saved_operator(func: Any) -> bool:
    """Whether the selective policy keeps the output of the aten operator ``func``."""
    return func in SAVED_OPERATORS


def alternated(name: str, occurrence: int) -> bool:
    """Whether ``every_second_mm`` recomputes this call, kept by the class policy otherwise.

    Args:
        name: The operator overload's name (``"aten.mm.default"``).
        occurrence: How many calls of it came before in the same module call.

    Returns:
        True for the 2nd, 4th, ... ``aten.mm`` call of a module call.
    """
    return name == ALTERNATED_OPERATOR and occurrence % 2 == 1


def unavailable_reason() -> str | None:
    """Why operator-grain checkpointing cannot run with this torch, or ``None``."""
    api = selective_checkpoint_api()
    return api if isinstance(api, str) else None


def _api() -> tuple[Any, Any]:
    """Return torch's ``(create_selective_checkpoint_contexts, CheckpointPolicy)``, or raise."""
    api = selective_checkpoint_api()
    if isinstance(api, str):
        raise RuntimeError(f"checkpointing: operator-grain checkpointing is unavailable: {api}.")
    return api


def _outside_hooks(contexts: tuple[Any, Any]) -> tuple[Any, Any]:
    forward, recompute = contexts
    # Our checkpoint keeps its activations through saved-tensor hooks; the cache must
    # stay outside them, or its kept outputs would be dropped like the rest.
    keep_selective_cache_outside_hooks(forward)
    return forward, recompute


def selective_context_fn(every_second_mm: bool = False) -> ContextFn:
    """Return a ``context_fn`` that keeps :data:`SAVED_OPERATORS` outputs, recomputes the rest.

    Args:
        every_second_mm: Recompute the 2nd, 4th, ... ``aten.mm`` of each call too
            (torchtitan's rule; :func:`alternated`). The count starts afresh with each
            call of ``context_fn`` (each module call), and a recomputation that asks the
            policy again (torch before 2.6 does) counts apart from the forward.

    Raises:
        RuntimeError: If this torch has no selective-checkpoint API (torch 2.4).
    """
    create, policy = _api()
    mm = torch.ops.aten.mm.default

    def choose(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        return policy.MUST_SAVE if func in SAVED_OPERATORS else policy.PREFER_RECOMPUTE

    def context_fn() -> Any:
        if not every_second_mm:
            return _outside_hooks(create(choose))
        counts = [0, 0]  # mm calls seen in the forward, in the recomputation

        def alternate(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
            if func == mm:
                seen = counts[ctx.is_recompute]
                counts[ctx.is_recompute] += 1
                if alternated(ALTERNATED_OPERATOR, seen):
                    return policy.PREFER_RECOMPUTE
            return choose(ctx, func)

        return _outside_hooks(create(alternate))

    result: Callable[[], Any] = context_fn
    return result


def operator_class_contexts() -> tuple[Any, Any]:
    """The contexts :func:`selective_context_fn`'s ``context_fn`` returns, built afresh.

    A function defined at module level: under ``torch.compile`` a checkpoint's
    ``context_fn`` must be a function dynamo can name (not a closure made while it
    traces), and a module that refers to it still pickles.
    """
    contexts: tuple[Any, Any] = selective_context_fn()()
    return contexts


class _Decision:
    """What the policy decided for the operator call in flight (``None``: not asked)."""

    def __init__(self) -> None:
        self.kept: bool | None = None


class _KeptCallsGuard(TorchDispatchMode):
    """Checks in the forward that the kept calls make an exact recomputation."""

    def __init__(self, owner: str, decision: _Decision) -> None:
        super().__init__()
        self.owner = owner
        self.decision = decision
        self.kept_storages: set[int] = set()
        self.drawn_kept = False

    def _mismatch(self, func: Any, problem: str) -> CheckpointError:
        return plan_mismatch(
            "operators", self.owner, f"{func} {problem}", ", or checkpoint this module whole"
        )

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        self.decision.kept = None
        out = func(*args, **kwargs)
        kept = bool(self.decision.kept)
        written = {storage_key(t) for t in written_tensors(func, args, kwargs)}
        for pointer in written:
            if (pointer in self.kept_storages) != kept:
                problem = (
                    "writes in place into a kept output but is not kept itself"
                    if not kept
                    else "is kept but writes in place into storage that is not kept"
                )
                raise self._mismatch(func, problem)
        if _draws(func):
            if kept:
                self.drawn_kept = True
            elif self.drawn_kept:
                raise self._mismatch(func, "draws random numbers after a kept draw")
        if kept and not written:
            self.kept_storages.update(
                storage_key(t) for t in tree_leaves(out) if isinstance(t, torch.Tensor)
            )
        return out


@contextmanager
def _guarded(forward: Any, guard: _KeptCallsGuard) -> Iterator[None]:
    """Enter torch's caching forward context, then the guard inside it."""
    with forward, guard:
        yield


def kept_calls_context_fn(kept: Iterable[tuple[str, int]], owner: str = "") -> ContextFn:
    """Return a ``context_fn`` that keeps the named operator calls, recomputes the rest.

    Args:
        kept: ``(operator, occurrence)`` pairs, such as ``("aten.addmm.default", 1)``
            for the module's second ``addmm`` call.
        owner: The module's qualified name, for error messages.

    Raises:
        RuntimeError: If this torch has no selective-checkpoint API (torch 2.4).
    """
    wanted = frozenset(kept)
    create, policy = _api()
    names: dict[Any, str] = {}

    def context_fn() -> Any:
        counts: tuple[dict[str, int], dict[str, int]] = ({}, {})
        decision = _Decision()

        def choose(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
            name = names.get(func) or names.setdefault(func, str(func))
            seen = counts[ctx.is_recompute]
            occurrence = seen.get(name, 0)
            seen[name] = occurrence + 1
            decision.kept = (name, occurrence) in wanted
            return policy.MUST_SAVE if decision.kept else policy.PREFER_RECOMPUTE

        forward, recompute = _outside_hooks(selective_contexts(create, choose))
        if torch.compiler.is_compiling():  # traced ops are functional; nothing to guard
            return forward, recompute
        return _guarded(forward, _KeptCallsGuard(owner, decision)), recompute

    result: Callable[[], Any] = context_fn
    return result
