"""The saved-tensor grain (``"recompute saved"``): drop or pack single saved tensors.

Each prefix of the call's greedy drop and pack units (:mod:`.._saved_grain`) is one
option; the plan keeps a :class:`SavedPlan`, which :class:`SavedTensorWrapper` carries
out through saved-tensor hooks. Those cannot be traced, so under ``torch.compile`` each
such call runs as a compiled form the plan records (:mod:`.._compiled`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from torch import nn

from accel import Accelerator

from ..._decisions import SAVED
from ..._saved_plan import DROP, PACK, SavedPlan
from ..._saved_wrapper import SavedTensorWrapper
from .._options import Call, Option, storage_bytes
from .._records import StepProfile
from .._saved_grain import prefix_seconds, saved_plan, saved_summary, saved_units
from .._store import decode_saved_plan, encode_saved_plan
from ._base import Grain

__all__ = ["SAVED_TENSORS"]


class SavedTensors(Grain[SavedPlan]):
    """Recompute single saved tensors from kept ones; pack host dropout masks."""

    name = SAVED
    coarseness = 4
    margin = 0.50
    recorded = True
    traceable = False
    call_cost = "saved_call_seconds"

    def options(self, call: Call) -> list[Option]:
        """One option per prefix of the call's units.

        Its recompute time is its recipes' and packs' time plus the hooks' per saved
        tensor (the rates' ``hook_seconds``).
        """
        profile, record = call.profile, call.record
        hooks = profile.rates.hook_seconds * len(record.packs)
        saves = {index for index, _ in record.packs if index is not None}
        found = []
        for prefix in saved_units(profile, call.name):
            dropped = {i for unit in prefix if unit.action == DROP for i in unit.storages}
            packed = {i for unit in prefix if unit.action == PACK for i in unit.storages}
            packed_bytes = sum(
                storage_bytes(profile, unit.storages) - unit.saved_bytes
                for unit in prefix
                if unit.action == PACK
            )
            read = frozenset[int]().union(*(unit.inputs for unit in prefix))
            # Every storage it saves and does not drop or pack stays, shared ones
            # included (a block's output, saved again by the next block, is freed only
            # if both drop it).
            kept = frozenset(saves - dropped - packed) | read
            seconds = hooks + prefix_seconds(prefix, record.packs, profile.rates.replay_seconds)
            base = call.option(SAVED, seconds, kept, kind=saved_summary(prefix))
            found.append(
                replace(
                    base,
                    saved_bytes=base.saved_bytes - packed_bytes,
                    extra_bytes=packed_bytes,
                    saved_units=tuple(prefix),
                )
            )
        return found

    def payload(self, profile: StepProfile, name: str, option: Option) -> SavedPlan:
        """The :class:`SavedPlan` of the option's units."""
        return saved_plan(profile, name, list(option.saved_units))

    def check(self, name: str, payload: object) -> SavedPlan:
        """``payload``; ``ValueError`` unless it is a :class:`SavedPlan`."""
        if isinstance(payload, SavedPlan):
            return payload
        raise ValueError(
            f"checkpointing: this plan recomputes saved tensors of {name!r} but has no "
            f"saved plan for it (its payload is {type(payload).__name__}). Use a plan "
            "made by plan_checkpointing, or give the decision a SavedPlan as its payload."
        )

    def wrapper(
        self,
        module: nn.Module,
        payload: SavedPlan,
        *,
        name: str,
        preserve_rng_state: bool,
        backend: Accelerator | None,
    ) -> nn.Module:
        """A :class:`SavedTensorWrapper` carrying out ``payload``."""
        return SavedTensorWrapper(
            module, payload, backend=backend, preserve_rng_state=preserve_rng_state
        )

    def encode(self, payload: SavedPlan) -> Any:
        """:func:`encode_saved_plan`."""
        return encode_saved_plan(payload)

    def decode(self, value: Any) -> SavedPlan:
        """:func:`decode_saved_plan`."""
        return decode_saved_plan(value)

    def compiled_as(self, payload: SavedPlan, form: str) -> SavedPlan:
        """``payload`` with ``compiled_as`` set to ``form``."""
        return replace(payload, compiled_as=form)


SAVED_TENSORS = SavedTensors()
