"""``apply_activation_checkpointing``: checkpoint a model's submodules, or plan to a budget.

The entry point most users call. With ``check_fn`` (or nothing) it wraps submodules
with :func:`checkpointing.checkpoint_wrapper` (:mod:`._wrapper`); with
``memory_budget`` it asks the planner (:mod:`.planner`) for a
:class:`checkpointing.CheckpointPlan` and applies it (:mod:`._plan`). Either way a
transformers KV cache is switched off first (:mod:`._caches`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from torch import nn

from accel import Accelerator

from ._args import resolve_backend, validate_budget
from ._caches import switch_off_kv_cache
from ._wrapper import CheckpointWrapper, checkpoint_wrapper
from .planner import plan_checkpointing

__all__ = ["apply_activation_checkpointing"]


def _children_to_wrap(
    parent: nn.Module, check_fn: Callable[[nn.Module], bool], visited: set[int]
) -> Iterator[tuple[nn.Module, str, nn.Module]]:
    if id(parent) in visited:
        return
    visited.add(id(parent))
    # _modules, not named_children(): a module registered twice is wrapped in both places.
    for name, child in list(parent._modules.items()):
        if child is None or isinstance(child, CheckpointWrapper):
            continue
        if check_fn(child):
            yield parent, name, child
        else:
            yield from _children_to_wrap(child, check_fn, visited)


def apply_activation_checkpointing(
    model: nn.Module,
    check_fn: Callable[[nn.Module], bool] | None = None,
    *,
    offload_to_cpu: bool = False,
    use_reentrant: bool = False,
    preserve_rng_state: bool = True,
    backend: Accelerator | str | None = None,
    memory_budget: float | int | None = None,
    example_inputs: Any = None,
) -> list[str]:
    """Wrap, in place, every submodule of ``model`` for which ``check_fn`` is true.

    Submodules are visited from the top; a wrapped submodule's own children are not
    visited, so checkpoints do not nest. ``model`` itself is never wrapped. A module
    that appears in several places gets one wrapper, shared.

    With ``memory_budget`` instead of ``check_fn``, the modules (and, inside modules,
    the cheap operators) to recompute are chosen by
    :func:`checkpointing.plan_checkpointing` from a profiled step of
    ``example_inputs``: the least recompute time whose activation memory fits.

    Example::

        from checkpointing import apply_activation_checkpointing

        apply_activation_checkpointing(
            model, check_fn=lambda m: isinstance(m, nn.TransformerEncoderLayer)
        )
        apply_activation_checkpointing(other, memory_budget=0.5, example_inputs=(x,))

    Args:
        model: The model to change in place.
        check_fn: Whether to wrap a submodule (default: every direct child).
        offload_to_cpu: As for :func:`checkpoint_wrapper`.
        use_reentrant: As for :func:`checkpoint_wrapper` (default ``False``).
        preserve_rng_state: As for :func:`checkpoint_wrapper`.
        backend: As for :func:`checkpoint_wrapper`.
        memory_budget: Activation memory to allow: a float fraction of the plain
            model's (0 < b <= 1) or an int number of bytes. Not with ``check_fn``.
        example_inputs: With ``memory_budget``: the model's positional arguments for
            one training step (a tuple, or a dict of keyword arguments).

    Returns:
        The qualified names of the wrapped submodules, in visiting order.

    Raises:
        ValueError: ``memory_budget`` with ``check_fn``, ``offload_to_cpu`` or
            ``use_reentrant``, or without ``example_inputs``; and as for
            :func:`checkpointing.plan_checkpointing`.
    """
    if memory_budget is not None:
        return _apply_budget(
            model,
            check_fn,
            memory_budget,
            example_inputs,
            offload_to_cpu,
            use_reentrant,
            preserve_rng_state,
            resolve_backend(backend),
        )
    switch_off_kv_cache(model)
    if check_fn is None:
        check_fn = _every_child
    names = {id(module): name for name, module in model.named_modules(remove_duplicate=False)}
    wrappers: dict[int, CheckpointWrapper] = {}
    wrapped: list[str] = []
    for parent, name, child in list(_children_to_wrap(model, check_fn, set())):
        wrapper = wrappers.get(id(child))
        if wrapper is None:
            wrapper = checkpoint_wrapper(
                child,
                offload_to_cpu,
                use_reentrant=use_reentrant,
                preserve_rng_state=preserve_rng_state,
                backend=backend,
            )
            wrappers[id(child)] = wrapper
        setattr(parent, name, wrapper)
        parent_name = names.get(id(parent), "")
        wrapped.append(f"{parent_name}.{name}" if parent_name else name)
    return wrapped


def _every_child(module: nn.Module) -> bool:
    return True


def _apply_budget(
    model: nn.Module,
    check_fn: Callable[[nn.Module], bool] | None,
    memory_budget: float | int,
    example_inputs: Any,
    offload_to_cpu: bool,
    use_reentrant: bool,
    preserve_rng_state: bool,
    backend: Accelerator | None,
) -> list[str]:
    validate_budget(memory_budget)
    conflicts = [
        name
        for name, given in (
            ("check_fn", check_fn is not None),
            ("offload_to_cpu", offload_to_cpu),
            ("use_reentrant", use_reentrant),
        )
        if given
    ]
    if conflicts:
        raise ValueError(
            f"checkpointing: memory_budget and {', '.join(conflicts)} were both given; "
            "with a budget the planner chooses what to checkpoint (non-reentrant, inputs "
            "kept on the device). Pass either memory_budget or check_fn, not both; to let "
            "a plan send saved activations to host memory, call plan_checkpointing(model, "
            "example_inputs, memory_budget, offload_activations=True) and apply the plan."
        )
    if example_inputs is None:
        raise ValueError(
            "checkpointing: memory_budget needs example_inputs, a tuple of the model's "
            "arguments for one training step, to profile its activation memory and operators. "
            "Pass example_inputs=(batch,)."
        )
    plan = plan_checkpointing(model, example_inputs, memory_budget, backend=backend)
    return plan.apply(model, preserve_rng_state=preserve_rng_state, backend=backend)
