"""A model sharded with FSDP2 before planning: profiled as each rank computes it.

FSDP2 (``fully_shard``) keeps each parameter of a sharded module as a ``DTensor``
shard and registers forward hooks on the module: before its forward they gather the
full parameters (in the compute dtype of its mixed-precision policy) and cast the
inputs, after it they free the gathered parameters again. The first forward of the
root also initialises FSDP2's state from the modules' parameters. Run as they are in
the fake-tensor profile, those hooks would take the profile's fake parameters for the
real shards (and keep them in FSDP2's state, so the first real step fails in
``fsdp.all_gather_copy_in``), and would run collectives on the one rank that plans.

So while the profile runs, :func:`unsharded` sets FSDP2's forward hooks aside, in
their places in the modules' hook dicts, and puts in their stead what they do to the
computation: the casts of the inputs and outputs that the policy asks for. Each
sharded parameter is profiled as the full parameter in the policy's compute dtype
(:func:`unsharded_fake`), which is what every rank's forward computes with; FSDP2's
state is not touched. Activations are per rank, so the plan fits each rank's step.

Where the model cannot run on fake tensors, the planner's fallback (one real forward)
would gather parameters on one rank only: it is refused, with the other order to use.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

__all__ = ["refuse_real_step", "runs_collectives", "unsharded", "unsharded_fake"]

# id of each FSDP2-sharded parameter -> its compute dtype, while a profile runs.
_SHARDED: ContextVar[dict[int, torch.dtype] | None] = ContextVar("_SHARDED", default=None)


def _states(model: nn.Module) -> list[tuple[nn.Module, Any]]:
    """Each module of ``model`` that FSDP2 sharded, with its FSDP2 state."""
    found = []
    for module in model.modules():
        get_state = getattr(type(module), "_get_fsdp_state", None)
        if callable(get_state):
            found.append((module, get_state(module)))
    return found


def _groups(state: Any) -> list[Any]:
    groups = getattr(state, "_fsdp_param_groups", None)  # torch 2.9 and later
    if groups is None:
        group = getattr(state, "_fsdp_param_group", None)  # torch 2.4 to 2.8
        groups = [] if group is None else [group]
    return list(groups)


def _cast(dtype: torch.dtype | None, value: Any) -> Any:
    if dtype is None:
        return value

    def cast(leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point() and leaf.dtype != dtype:
            return leaf.to(dtype)
        return leaf

    return tree_map(cast, value)


def _owned_by(hook: Any, state: Any) -> bool:
    """Whether ``hook`` is a method of ``state``, or wraps one (FSDP2's grouped hooks)."""
    for _ in range(8):  # a bound method's __wrapped__ is its function's: check each level
        if hook is None:
            return False
        if getattr(hook, "__self__", None) is state:
            return True
        hook = getattr(hook, "__wrapped__", None)
    return False


def _stand_ins(state: Any) -> tuple[Any, Any]:
    """The casts FSDP2's forward hooks apply, without the gathers and the state."""
    policy = getattr(state, "_mp_policy", None)
    param_dtype = getattr(policy, "param_dtype", None)
    inputs_dtype = param_dtype if getattr(policy, "cast_forward_inputs", False) else None
    output_dtype = getattr(policy, "output_dtype", None)

    def before(module: nn.Module, args: Any, kwargs: Any) -> tuple[Any, Any]:
        return _cast(inputs_dtype, args), _cast(inputs_dtype, kwargs)

    def after(module: nn.Module, args: Any, output: Any) -> Any:
        return _cast(output_dtype, output)

    return before, after


@contextmanager
def unsharded(model: nn.Module) -> Iterator[None]:
    """Profile ``model`` as if unsharded: FSDP2's forward hooks set aside (module docstring)."""
    states = _states(model)
    if not states:
        yield
        return
    dtypes: dict[int, torch.dtype] = {}
    replaced: list[tuple[dict[int, Any], int, Any]] = []
    for module, state in states:
        param_dtype = getattr(getattr(state, "_mp_policy", None), "param_dtype", None)
        for group in _groups(state):
            for fsdp_param in getattr(group, "fsdp_params", ()):
                param = fsdp_param.sharded_param
                dtypes[id(param)] = param_dtype or param.dtype
        before, after = _stand_ins(state)
        pairs = ((module._forward_pre_hooks, before), (module._forward_hooks, after))
        found = len(replaced)
        for hooks, stand_in in pairs:
            for key, hook in list(hooks.items()):
                if _owned_by(hook, state):
                    replaced.append((hooks, key, hook))
                    hooks[key] = stand_in
        if len(replaced) == found:
            for hooks, key, hook in replaced:
                hooks[key] = hook
            raise ValueError(
                f"checkpointing: the model is sharded with FSDP2, and this torch "
                f"({torch.__version__}) registers FSDP2's forward hooks in a way the planner "
                "does not know, so profiling would run them on fake tensors. Plan the model "
                "before sharding it: plan = plan_checkpointing(model, ...), "
                "plan.apply(model), then fully_shard each block and the root."
            )
    token = _SHARDED.set(dtypes)
    try:
        yield
    finally:
        _SHARDED.reset(token)
        for hooks, key, hook in replaced:
            hooks[key] = hook


def unsharded_fake(mode: Any, tensor: torch.Tensor) -> torch.Tensor | None:
    """The fake full parameter for an FSDP2 shard while :func:`unsharded` runs, else None."""
    dtypes = _SHARDED.get()
    dtype = None if dtypes is None else dtypes.get(id(tensor))
    if dtype is None:
        return None
    with mode:
        return torch.empty(tensor.shape, dtype=dtype, device=tensor.device)


def refuse_real_step(model: nn.Module, reason: str) -> None:
    """Raise where ``model`` is sharded with FSDP2 and would be profiled on real tensors.

    Raises:
        ValueError: If a module of ``model`` is sharded with FSDP2.
    """
    if _states(model):
        raise ValueError(
            f"checkpointing: {reason}, and the model is sharded with FSDP2, whose real "
            "forward would gather parameters on the planning rank alone. Plan the model "
            "before sharding it: plan = plan_checkpointing(model, ...), plan.apply(model), "
            "then fully_shard each block and the root."
        )


def runs_collectives(model: nn.Module) -> bool:
    """Whether a forward of ``model`` may run collectives: FSDP2, DDP or DTensor state.

    Planning runs on rank 0 alone (:func:`._agree.agreed`), where a collective would wait
    for ranks that never join it: such a model gets no real forward while it is planned.
    """
    if _states(model):
        return True
    for module in model.modules():
        if isinstance(module, nn.parallel.DistributedDataParallel):
            return True
    dtensor = getattr(getattr(torch.distributed, "tensor", None), "DTensor", None)
    return dtensor is not None and any(isinstance(p, dtensor) for p in model.parameters())
