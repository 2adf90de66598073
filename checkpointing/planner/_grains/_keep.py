"""The keep grain (``"keep"``): the module call runs as it is and keeps what it saves.

Keeping is what a call the plan does not name does, so the search is offered no option
for it; it names what a plan's table shows for such a module, and what a call runs as
under ``torch.compile`` where no region keeps less (:mod:`.._compiled`).
"""

from __future__ import annotations

from torch import nn

from accel import Accelerator

from ..._decisions import KEEP
from .._options import Call, Option
from ._base import PayloadFree

__all__ = ["KEPT", "Keep"]


class Keep(PayloadFree):
    """Leave the module call as it is."""

    name = KEEP

    def options(self, call: Call) -> list[Option]:
        """None: the search keeps a call by not choosing it."""
        return []

    def wrapper(
        self,
        module: nn.Module,
        payload: None,
        *,
        name: str,
        preserve_rng_state: bool,
        backend: Accelerator | None,
    ) -> nn.Module:
        """``module`` itself."""
        return module


KEPT = Keep()
