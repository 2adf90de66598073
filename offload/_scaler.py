"""Loss scaling for float16 training whose gradients may live in host memory.

``torch.amp.GradScaler`` is bound to one device type and keeps its scale and overflow
flags as tensors there, which does not fit gradients that offload moved to the host
(fairscale's OffloadModel could not use it for that reason). :class:`LossScaler` keeps
the scale as a Python float, multiplies the loss by it, and unscales each gradient where
it is, device or host, with one multiplication. With the default powers of two, scaling
and unscaling are exact: unless something overflowed, the unscaled gradients are
bit-for-bit those of the unscaled loss.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from ._errors import OffloadConfigError

__all__ = ["LossScaler"]


class LossScaler:
    """A static or dynamic loss scale, for gradients on any device.

    Dynamic scaling (the default) halves the scale after a step whose gradients
    overflowed (that step is skipped) and doubles it after ``growth_interval`` steps
    without overflow, like ``torch.amp.GradScaler``.

    Args:
        init_scale: The first scale.
        growth_factor: Multiplies the scale after ``growth_interval`` clean steps.
        backoff_factor: Multiplies the scale after an overflow.
        growth_interval: Clean steps between growths.
        min_scale: The scale never goes below this.
        dynamic: ``False`` keeps ``init_scale`` forever (steps with overflow are still
            skipped).
    """

    def __init__(
        self,
        init_scale: float = 2.0**16,
        *,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        min_scale: float = 1.0,
        dynamic: bool = True,
    ) -> None:
        if not (math.isfinite(init_scale) and init_scale > 0):
            raise OffloadConfigError(
                f"offload: the loss scale must be a positive finite number, got {init_scale!r}."
            )
        if growth_factor < 1.0 or not 0.0 < backoff_factor < 1.0 or growth_interval < 1:
            raise OffloadConfigError(
                "offload: LossScaler needs growth_factor >= 1, 0 < backoff_factor < 1 and "
                f"growth_interval >= 1; got {growth_factor}, {backoff_factor}, "
                f"{growth_interval}."
            )
        self.scale = float(init_scale)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.min_scale = float(min_scale)
        self.dynamic = dynamic
        self._clean_steps = 0

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """Return ``loss`` multiplied by the current scale."""
        return loss * self.scale

    def unscale_(self, parameters: Iterable[torch.Tensor]) -> bool:
        """Divide every gradient by the scale in place; return whether any is inf or NaN.

        One host synchronisation per device holding gradients.
        """
        inverse = 1.0 / self.scale
        finite: dict[torch.device, torch.Tensor] = {}
        for parameter in parameters:
            grad = parameter.grad
            if grad is None:
                continue
            grad.mul_(inverse)
            ok = torch.isfinite(grad).all()
            previous = finite.get(grad.device)
            finite[grad.device] = ok if previous is None else previous & ok
        return not all(bool(flag) for flag in finite.values())

    def update(self, found_inf: bool) -> None:
        """Adjust the scale after a step (dynamic scaling only)."""
        if not self.dynamic:
            return
        if found_inf:
            self.scale = max(self.scale * self.backoff_factor, self.min_scale)
            self._clean_steps = 0
            return
        self._clean_steps += 1
        if self._clean_steps >= self.growth_interval:
            self.scale *= self.growth_factor
            self._clean_steps = 0

    def state_dict(self) -> dict[str, Any]:
        """Return the scale and the growth counter."""
        return {"scale": self.scale, "clean_steps": self._clean_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.scale = float(state["scale"])
        self._clean_steps = int(state["clean_steps"])

    def __repr__(self) -> str:
        kind = "dynamic" if self.dynamic else "static"
        return f"LossScaler({kind}, scale={self.scale:g})"
