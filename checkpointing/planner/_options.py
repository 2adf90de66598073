"""The ways to checkpoint one module, and what each saves and costs.

For every candidate module call (each call of a module called several times per step
is a candidate of its own, named ``"name@k"``; a candidate has submodules or saves
activations itself: a leaf such as
``nn.LSTM`` or a user's childless layer; the root where its own operators save
activations, whole only; an RNN, whose layers are fused kernels, whole only too) the
options are: one saved-tensor plan per
prefix of its greedy drop and pack units (:mod:`._saved_grain`); the whole module (keep
its inputs); a selective checkpoint by operator class (keep matmul and attention outputs,
:mod:`._selective`), and the same with torchtitan's rule where the call runs two
``aten.mm`` or more (every second ``mm`` recomputed too); and one selective checkpoint
per prefix of its units in greedy order, keeping the chosen calls (:mod:`._kept_ops`).
Each option's bytes saved are exclusive to the module call; its time is the cost
model's estimate of the recomputation (:mod:`._cost`), with the selective policy's or
the saved-tensor hooks' own overhead per call added.
Modules that contain batch norm in training (running statistics) get no selective
option: the recomputation gives such modules fresh buffers, a call the selective
policy never saw in the forward. Modules that call an operator whose output shape or
value the data decides (``nonzero``, ``masked_select``, ``item``: mixture-of-experts
routing) get neither a saved-tensor nor a chosen-calls option, whose recorded positions
and occurrences would not hold in another step.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from accel._compat import selective_cache_allows_mutation

from .._decisions import ALTERNATE, CHOSEN, FULL, SAVED, SELECTIVE
from .._replay import counted
from .._saved_plan import DROP, PACK
from .._selective import alternated
from ._kept_ops import Unit, find_units, keep_options
from ._records import OpCall, StepProfile
from ._saved_grain import SavedUnit, saved_summary, saved_units

__all__ = [
    "Option",
    "candidates",
    "nothing_to_checkpoint",
    "own_work",
    "owned",
    "storage_bytes",
]


@dataclass(frozen=True)
class Option:
    """One way to checkpoint a module: its decision, bytes saved and recompute time."""

    decision: str
    saved_bytes: int  # activation bytes removed (negative: added)
    seconds: float
    kept: frozenset[int]
    kind: str = "module"
    calls: tuple[tuple[str, int], ...] = ()
    policy_calls: int = 0  # operator calls a selective policy sees
    kept_count: int = 0  # of those, the kept ones
    extra_bytes: int = 0  # bytes held outside ``kept``: packed masks
    saved_units: tuple[SavedUnit, ...] = ()  # a saved-tensor option's drops and packs


def storage_bytes(profile: StepProfile, indices: Iterable[int]) -> int:
    """The bytes of the distinct storages ``indices`` name in ``profile``."""
    return sum(profile.storage_bytes[index] for index in set(indices))


def _kept_summary(units: list[Unit]) -> str:
    """``ops kept: addmm x3, bernoulli_ x2``: what a chosen-calls option keeps, by label."""
    return "ops kept: " + counted(unit.label for unit in units)


def _options(profile: StepProfile, name: str, selective: bool) -> list[Option]:
    """The ways to checkpoint module call ``name``, with their exclusive savings.

    A selective option's recompute time is the module's forward time, less the own
    time of the operators it keeps (torchtitan's rule keeps the class's outputs but
    every second ``mm``'s, and recomputes those), plus what its policy costs per
    operator call and per kept call; a saved-tensor option's is its recipes' and packs'
    time plus its hooks' per saved tensor (the rates' ``policy_*`` and ``hook_seconds``).
    """
    record = profile.modules[name]
    rates = profile.rates
    hooks = rates.hook_seconds * len(record.packs)
    mine = owned(profile, name)

    def option(decision: str, seconds: float, kept: frozenset[int], **more: Any) -> Option:
        saved = storage_bytes(profile, mine - kept) - storage_bytes(
            profile, kept - profile.saved_by.keys()
        )
        return Option(decision, saved, seconds, kept, **more)

    inputs = frozenset(record.inputs)
    saves = {index for index, _ in record.packs if index is not None}
    options = [option(FULL, record.forward_time, inputs)]
    if not name or record.fused_rnn:
        # The root: whole only (the model in one piece, see CheckpointPlan.apply). An RNN
        # (nn.LSTM, nn.GRU): whole only, as its layers are fused kernels (on a host
        # mkldnn_rnn_layer, elsewhere the device library's) that return a workspace
        # beside their outputs, differ between backends, and save little a cheap
        # operator could rebuild; checkpointed whole it replays its dropout exactly.
        return options
    # Saved-tensor positions and operator occurrences are recorded once; where the data
    # decides shapes or how many calls run (routing), only grains without them remain.
    stable = not record.data_dependent
    for prefix in saved_units(profile, name) if stable else []:
        dropped = {i for unit in prefix if unit.action == DROP for i in unit.storages}
        packed = {i for unit in prefix if unit.action == PACK for i in unit.storages}
        packed_bytes = sum(
            storage_bytes(profile, unit.storages) - unit.saved_bytes
            for unit in prefix
            if unit.action == PACK
        )
        read = frozenset[int]().union(*(unit.inputs for unit in prefix))
        # Every storage it saves and does not drop or pack stays, shared ones included
        # (a block's output, saved again by the next block, is freed only if both drop it).
        kept = frozenset(saves - dropped - packed) | read
        seconds = hooks + sum(unit.seconds for unit in prefix)
        base = option(SAVED, seconds, kept, kind=saved_summary(prefix))
        options.append(
            replace(
                base,
                saved_bytes=base.saved_bytes - packed_bytes,
                extra_bytes=packed_bytes,
                saved_units=tuple(prefix),
            )
        )
    if not selective or record.running_stats:
        # The running-statistics guard gives batch norm fresh buffers in the
        # recomputation (a clone a selective policy never saw in the forward), so
        # torch's selective checkpoint fails in backward: only whole-module and
        # saved-tensor grains are offered around such modules.
        return options
    calls = len(record.ops)

    def by_class(decision: str, kind: str, recomputed: list[OpCall]) -> Option:
        """The class policy, with the class's kept ``recomputed`` calls recomputed too."""
        cached = record.cached.difference(*(op.fresh for op in recomputed))
        return option(
            decision,
            record.recomputed_time
            + sum(op.seconds for op in recomputed)
            + rates.policy_call_seconds * calls
            + rates.policy_kept_seconds * len(cached),
            inputs | cached,
            kind=kind,
            policy_calls=calls,
            kept_count=len(cached),
        )

    options.append(by_class(SELECTIVE, "ops: pointwise, dropout, norm", []))
    halved = [op for op in record.ops if alternated(op.name, op.occurrence)]
    if halved:  # without a second mm it is the class policy itself: not offered twice
        kind = "ops: pointwise, dropout, norm, every second mm"
        options.append(by_class(ALTERNATE, kind, halved))
    units = find_units(record.ops, selective_cache_allows_mutation()) if stable else []
    for numbers in keep_options(units, profile.storage_bytes, record.inputs):
        chosen = [units[number] for number in numbers]
        kept_calls = tuple(sorted(call for unit in chosen for call in unit.calls))
        recompute = max(record.forward_time - sum(unit.seconds for unit in chosen), 0.0)
        options.append(
            option(
                CHOSEN,
                recompute
                + rates.policy_call_seconds * calls
                + rates.policy_kept_seconds * len(kept_calls),
                inputs.union(*(unit.storages for unit in chosen)),
                kind=_kept_summary(chosen),
                calls=kept_calls,
                policy_calls=calls,
                kept_count=len(kept_calls),
            )
        )
    return options


def candidates(profile: StepProfile, selective: bool) -> dict[str, list[Option]]:
    """Every candidate module call's options."""
    return {
        name: _options(profile, name, selective)
        for name in profile.modules
        if _is_candidate(profile, name)
    }


def owned(profile: StepProfile, name: str) -> set[int]:
    """The saved storages only module ``name`` saves (inside it, wherever saved)."""
    return {
        index
        for index, stacks in profile.saved_by.items()
        if all(name in stack for stack in stacks)
    }


def own_work(profile: StepProfile) -> bool:
    """Whether the root's own operators (outside every submodule) save activations."""
    return any(all(stack == ("",) for stack in stacks) for stacks in profile.saved_by.values())


def _is_candidate(profile: StepProfile, name: str) -> bool:
    """A module call that is a block or saves activations.

    A module with submodules is a candidate as before; a leaf (``nn.LSTM``, a user's
    childless layer) when it saves activations of its own; the root when its own
    operators (outside every submodule) save activations: checkpointed whole, it keeps
    only the model's inputs.
    """
    if not name:
        return own_work(profile)
    record = profile.modules[name]
    return bool(record.children) or bool(owned(profile, name))


def nothing_to_checkpoint(profile: StepProfile) -> str:
    """Why no module of the profiled model is a candidate: a sentence for the error."""
    return (
        "no module of this model can be checkpointed, so no memory budget below 1.0 can "
        "be reached: neither its submodules nor the model's own operators save "
        "activations for backward. Train it without a budget."
    )
