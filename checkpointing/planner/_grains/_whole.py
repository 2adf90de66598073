"""The whole-module grain (``"checkpoint"``): keep the call's inputs, recompute all of it."""

from __future__ import annotations

from torch import nn

from accel import Accelerator

from ..._decisions import FULL
from ..._wrapper import checkpoint_wrapper
from .._options import Call, Option
from ._base import PayloadFree

__all__ = ["WHOLE"]


class WholeModule(PayloadFree):
    """Checkpoint the module call whole: it recomputes exactly the operators priced."""

    name = FULL
    coarseness = 0
    margin = 0.0
    fine = False
    compiled_form = True
    call_cost = "region_seconds"
    tensor_cost = "region_tensor_seconds"

    def options(self, call: Call) -> list[Option]:
        """One option: keep the inputs, recompute the call's forward (its operators)."""
        return [call.option(FULL, call.record.forward_time, call.inputs)]

    def wrapper(
        self,
        module: nn.Module,
        payload: None,
        *,
        name: str,
        preserve_rng_state: bool,
        backend: Accelerator | None,
    ) -> nn.Module:
        """A :class:`CheckpointWrapper` around ``module``."""
        return checkpoint_wrapper(module, preserve_rng_state=preserve_rng_state, backend=backend)


WHOLE = WholeModule()
