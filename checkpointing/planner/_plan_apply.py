"""Carrying a plan out on a model: each decision's grain checks it and wraps its module.

Every decision is checked before anything is wrapped, so a plan refused leaves the
model as it was.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from accel import Accelerator

from .._caches import switch_off_kv_cache
from .._decisions import FULL
from .._per_call import PerCallWrapper, count_calls_per_forward
from .._root import checkpoint_root, root_checkpointed
from .._wrapper import CheckpointWrapper
from ._enclosed import Enclosed
from ._grains import Decision, Grain, coarseness_order, grain_named
from ._records import parse_call

__all__ = ["apply_decisions"]


def _checked(name: str, decision: Decision) -> tuple[Grain[Any], Any]:
    """``decision``'s grain and its checked payload; ``ValueError`` if either is wrong."""
    grain = grain_named(decision.grain)
    if grain is None:
        known = ", ".join(map(repr, coarseness_order()))
        raise ValueError(
            f"checkpointing: this plan says {decision.grain!r} for {name!r}, which this "
            f"release does not know (it knows {known}). Plan again with this release, or "
            "load the plan with the release that made it."
        )
    return grain, grain.check(name, decision.payload)


def _target(model: nn.Module, module: str) -> tuple[nn.Module, str, nn.Module]:
    parent_name, _, leaf = module.rpartition(".")
    try:
        parent = model.get_submodule(parent_name)
        child = parent.get_submodule(leaf)
    except AttributeError as error:
        raise ValueError(
            f"checkpointing: this plan checkpoints {module!r}, which the model does "
            f"not have ({error}). Apply a plan to the model it was made for, or "
            "to one built the same way."
        ) from None
    if isinstance(child, CheckpointWrapper):
        raise ValueError(
            f"checkpointing: {module!r} is already checkpointed; apply a plan to a "
            "model without checkpoint wrappers."
        )
    return parent, leaf, child


def _check_root(model: nn.Module, decision: Decision) -> None:
    """Raise ``ValueError`` unless the root's decision can be carried out on ``model``."""
    if decision.grain != FULL:
        raise ValueError(
            f"checkpointing: this plan says {decision.grain!r} for the model itself "
            "(the root module, named ''); the root can only be checkpointed whole "
            "('checkpoint'). Use a plan made by plan_checkpointing."
        )
    if root_checkpointed(model):
        raise ValueError(
            "checkpointing: the model itself is already checkpointed whole; apply a "
            "plan to a model without checkpoint wrappers."
        )


def apply_decisions(
    decisions: dict[str, Decision],
    calls: dict[str, int],
    model: nn.Module,
    preserve_rng_state: bool,
    backend: Accelerator | None,
    enclosed: Enclosed | None = None,
) -> None:
    """Wrap, in place, the module calls ``decisions`` names (see ``CheckpointPlan.apply``).

    Args:
        decisions: Module call to decision (a module's name, or ``"name@k"``).
        calls: For each module called several times per step, how many times.
        model: The model, checked against the plan already.
        preserve_rng_state: Replay the generator states in recomputation.
        backend: The backend; ``None`` means :func:`accel.get_backend` at each call.
        enclosed: For each planned call, the calls of per-call modules made inside it
            (``CheckpointPlan.enclosed``); those are neither counted nor wrapped.
    """
    enclosed = enclosed or {}
    checked = {name: _checked(name, decision) for name, decision in decisions.items()}
    grouped: dict[str, dict[int, str]] = {}
    for name in decisions:
        module, call = parse_call(name)
        grouped.setdefault(module, {})[call] = name
    inside = _inside(enclosed, decisions, calls)
    targets: list[tuple[str, nn.Module, str, nn.Module]] = []
    for module in grouped:
        if not module:
            _check_root(model, decisions[""])
            continue
        targets.append((module, *_target(model, module)))
    switch_off_kv_cache(model)
    if "" in decisions:
        checkpoint_root(model, preserve_rng_state=preserve_rng_state, backend=backend)

    def wrapped(name: str, child: nn.Module) -> nn.Module:
        grain, payload = checked[name]
        return grain.wrapper(
            child, payload, name=name, preserve_rng_state=preserve_rng_state, backend=backend
        )

    per_call: dict[str, tuple[PerCallWrapper, list[int]]] = {}
    regions = {parse_call(name)[0] for name in enclosed}
    for module, parent, leaf, child in targets:
        names = grouped[module]
        if module in calls or module in regions:
            counted = [k for k in range(calls.get(module, 1)) if k not in inside.get(module, ())]
            variants = [wrapped(names[k], child) if k in names else None for k in counted]
            wrapper = PerCallWrapper(child, variants)
            per_call[module] = wrapper, counted
            setattr(parent, leaf, wrapper)
            count_calls_per_forward(model)
        else:
            setattr(parent, leaf, wrapped(names[0], child))
    for name, inner in enclosed.items():
        module, call = parse_call(name)
        outer, counted = per_call[module]
        outer.enclose(counted.index(call), [per_call[m][0] for m in inner])


def _inside(
    enclosed: Enclosed, decisions: dict[str, Decision], calls: dict[str, int]
) -> dict[str, set[int]]:
    """The enclosed calls by module; ``ValueError`` where ``enclosed`` disagrees with the plan."""
    inside: dict[str, set[int]] = {}
    for name, inner in enclosed.items():
        for module, numbers in inner.items():
            inside.setdefault(module, set()).update(numbers)
            known = module in calls and all(0 <= k < calls[module] for k in numbers)
            if name not in decisions or not known:
                raise ValueError(
                    f"checkpointing: this plan says {name!r} encloses calls "
                    f"{list(numbers)} of {module!r}, which its decisions and call counts "
                    "do not have. Plan again with plan_checkpointing, or load the plan "
                    "file as CheckpointPlan.save wrote it."
                )
    for name in decisions:
        module, call = parse_call(name)
        if call in inside.get(module, ()):
            raise ValueError(
                f"checkpointing: this plan wraps {name!r} and also runs it inside another "
                "planned call, which a plan never does. Plan again with plan_checkpointing."
            )
    return inside
