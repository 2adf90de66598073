"""The chosen-calls grain (``"keep costly ops"``): keep the operator calls the planner chose.

The call's operators are grouped into units (:mod:`.._kept_ops`), ordered by recompute
time saved per byte kept; each prefix is one option, and the plan keeps its
``(operator, occurrence)`` calls.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from accel import Accelerator
from accel._compat import selective_cache_allows_mutation

from ..._decisions import CHOSEN
from ..._replay import counted
from ..._selective_wrapper import SelectiveCheckpointWrapper
from .._kept_ops import Unit, find_units, keep_options
from .._options import Call, Option
from .._pricing import dispatched
from .._records import StepProfile
from ._base import Grain

__all__ = ["CHOSEN_CALLS", "KeptCalls"]

KeptCalls = tuple[tuple[str, int], ...]


def _summary(units: list[Unit]) -> str:
    """``ops kept: addmm x3, bernoulli_ x2``: what an option keeps, by label."""
    return "ops kept: " + counted(unit.label for unit in units)


class ChosenCalls(Grain[KeptCalls]):
    """Selective checkpoint that keeps exactly the chosen operator calls."""

    name = CHOSEN
    coarseness = 3
    margin = 0.25
    call_cost = "region_seconds"
    tensor_cost = "region_tensor_seconds"
    recorded = True
    selective = True

    def options(self, call: Call) -> list[Option]:
        """One option per prefix of the call's units in greedy order.

        Its recompute time is the call's forward time less the kept units' own time,
        plus what the policy costs per operator call the device dispatches and per
        kept call.
        """
        record, rates = call.record, call.profile.rates
        units = find_units(record.ops, selective_cache_allows_mutation())
        calls = dispatched(record.ops)
        found = []
        for numbers in keep_options(units, call.profile.storage_bytes, record.inputs):
            chosen = [units[number] for number in numbers]
            kept_calls = tuple(sorted(c for unit in chosen for c in unit.calls))
            recompute = max(record.forward_time - sum(unit.seconds for unit in chosen), 0.0)
            found.append(
                call.option(
                    CHOSEN,
                    recompute
                    + rates.policy_call_seconds * calls
                    + rates.policy_kept_seconds * len(kept_calls),
                    call.inputs.union(*(unit.storages for unit in chosen)),
                    kind=_summary(chosen),
                    calls=kept_calls,
                    policy_calls=calls,
                    kept_count=len(kept_calls),
                )
            )
        return found

    def payload(self, profile: StepProfile, name: str, option: Option) -> KeptCalls:
        """The option's kept ``(operator, occurrence)`` calls."""
        return option.calls

    def check(self, name: str, payload: object) -> KeptCalls:
        """``payload`` as kept calls; ``ValueError`` unless it is a sequence of pairs."""
        if isinstance(payload, (tuple, list)) and all(
            isinstance(c, (tuple, list))
            and len(c) == 2
            and isinstance(c[0], str)
            and isinstance(c[1], int)
            for c in payload
        ):
            return tuple((str(op), int(n)) for op, n in payload)
        raise ValueError(
            f"checkpointing: this plan keeps chosen operator calls in {name!r} but names "
            f"none (its payload is {type(payload).__name__}, not (operator, occurrence) "
            "pairs). Use a plan made by plan_checkpointing, or give the decision the kept "
            "calls as its payload."
        )

    def wrapper(
        self,
        module: nn.Module,
        payload: KeptCalls,
        *,
        name: str,
        preserve_rng_state: bool,
        backend: Accelerator | None,
    ) -> nn.Module:
        """A :class:`SelectiveCheckpointWrapper` that keeps ``payload``'s calls."""
        return SelectiveCheckpointWrapper(
            module,
            preserve_rng_state=preserve_rng_state,
            backend=backend,
            kept_calls=payload,
            name=name,
        )

    def encode(self, payload: KeptCalls) -> Any:
        """``[[operator, occurrence], ...]``."""
        return [list(c) for c in payload]

    def decode(self, value: Any) -> KeptCalls:
        """The inverse of :meth:`encode`."""
        return tuple((str(op), int(n)) for op, n in value)


CHOSEN_CALLS = ChosenCalls()
