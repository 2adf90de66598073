"""The operator-class grain (``"recompute cheap ops"``), and torchtitan's rule as its option.

Inside the module call, keep the outputs of matrix products, convolutions and attention
and recompute pointwise operators, dropout and normalisation (:mod:`..._selective`).
Torchtitan's rule (``"recompute cheap ops, every second mm"``) recomputes every second
``aten.mm`` of the call too; it is offered where the call runs two ``mm`` or more
(without a second one it is the class policy itself, not offered twice).
"""

from __future__ import annotations

from torch import nn

from accel import Accelerator

from ..._decisions import ALTERNATE, SELECTIVE
from ..._selective import alternated
from ..._selective_wrapper import SelectiveCheckpointWrapper
from .._options import Call, Option
from .._pricing import dispatched
from ._base import PayloadFree

__all__ = ["EVERY_SECOND_MM", "OPERATOR_CLASS"]


class OperatorClass(PayloadFree):
    """Selective checkpoint by operator class, with or without torchtitan's rule."""

    margin = 0.10
    selective = True
    call_cost = "region_seconds"
    tensor_cost = "region_tensor_seconds"

    def __init__(self, every_second_mm: bool) -> None:
        self.every_second_mm = every_second_mm
        self.name = ALTERNATE if every_second_mm else SELECTIVE
        self.coarseness = 2 if every_second_mm else 1
        self.compiled_form = not every_second_mm

    def options(self, call: Call) -> list[Option]:
        """The class policy's one option (with the rule, only where a second ``mm`` runs).

        Its recompute time is the call's forward time less the own time of the operators
        it keeps (with the rule, every second ``mm``'s recomputed too), plus what the
        policy costs per operator call the device dispatches and per kept call (the
        rates' ``policy_*``).
        """
        record, rates = call.record, call.profile.rates
        recomputed = (
            [op for op in record.ops if alternated(op.name, op.occurrence)]
            if self.every_second_mm
            else []
        )
        if self.every_second_mm and not recomputed:
            return []
        kind = "ops: pointwise, dropout, norm" + (
            ", every second mm" if self.every_second_mm else ""
        )
        cached = record.cached.difference(*(op.fresh for op in recomputed))
        calls = dispatched(record.ops)
        seconds = (
            record.recomputed_time
            + sum(op.seconds for op in recomputed)
            + rates.policy_call_seconds * calls
            + rates.policy_kept_seconds * len(cached)
        )
        return [
            call.option(
                self.name,
                seconds,
                call.inputs | cached,
                kind=kind,
                policy_calls=calls,
                kept_count=len(cached),
            )
        ]

    def wrapper(
        self,
        module: nn.Module,
        payload: None,
        *,
        name: str,
        preserve_rng_state: bool,
        backend: Accelerator | None,
    ) -> nn.Module:
        """A :class:`SelectiveCheckpointWrapper` with the class policy (and the rule)."""
        return SelectiveCheckpointWrapper(
            module,
            preserve_rng_state=preserve_rng_state,
            backend=backend,
            name=name,
            every_second_mm=self.every_second_mm,
        )


OPERATOR_CLASS = OperatorClass(every_second_mm=False)
EVERY_SECOND_MM = OperatorClass(every_second_mm=True)
