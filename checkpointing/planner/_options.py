"""What the grains' options are made of: the module call they are for, and what they save.

For every candidate module call (:func:`is_candidate`: each call of a module called
several times per step is a candidate of its own, named ``"name@k"``; a candidate has
submodules or saves activations itself: a leaf such as ``nn.LSTM`` or a user's childless
layer; the root where its own operators save activations) each grain
(:mod:`._grains`) builds its :class:`Option` objects from the call's :class:`Call`. Each
option's bytes saved are exclusive to the module call; its time is the cost model's
estimate of the recomputation (:mod:`._cost`), with the grain's own overhead per call
added.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ._offload_settings import OffloadSettings
from ._records import ModuleProfile, StepProfile
from ._saved_grain import SavedUnit

__all__ = [
    "Call",
    "Option",
    "is_candidate",
    "nothing_to_checkpoint",
    "own_work",
    "owned",
    "storage_bytes",
]


@dataclass(frozen=True)
class Option:
    """One way to checkpoint a module: its grain's name (``decision``), bytes saved, time."""

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
    payload: Any = None  # what a plan taking it keeps, where the grain builds it here


def storage_bytes(profile: StepProfile, indices: Iterable[int]) -> int:
    """The bytes of the distinct storages ``indices`` name in ``profile``."""
    return sum(profile.storage_bytes[index] for index in set(indices))


@dataclass(frozen=True)
class Call:
    """One candidate module call, as a grain sees it when it builds its options."""

    profile: StepProfile
    name: str
    record: ModuleProfile
    mine: frozenset[int]  # the saved storages only this call saves (:func:`owned`)
    inputs: frozenset[int]  # its inputs' storages
    offload: OffloadSettings | None = None  # the offload grain's, where it is asked for

    @classmethod
    def of(cls, profile: StepProfile, name: str, offload: OffloadSettings | None = None) -> Call:
        """Module call ``name`` of ``profile``."""
        record = profile.modules[name]
        mine, inputs = frozenset(owned(profile, name)), frozenset(record.inputs)
        return cls(profile, name, record, mine, inputs, offload)

    def option(self, decision: str, seconds: float, kept: frozenset[int], **more: Any) -> Option:
        """An option that keeps ``kept``, with the bytes it saves exclusive to this call.

        It saves what this call alone saves and ``kept`` leaves out, less the bytes of
        kept storages nothing saves (a selective option's kept outputs, say).
        """
        profile = self.profile
        saved = storage_bytes(profile, self.mine - kept) - storage_bytes(
            profile, kept - profile.saved_by.keys()
        )
        return Option(decision, saved, seconds, kept, **more)


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


def is_candidate(profile: StepProfile, name: str) -> bool:
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
