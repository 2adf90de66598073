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
    without overflow, like ``torch.amp.GradScaler``. With ``hysteresis=n`` (DeepSpeed's
    option) the scale is kept through ``n - 1`` overflowed steps and halved at the
    ``n``-th; growing the scale restores the allowance. Overflowed steps are always
    skipped. Sparse gradients (``nn.Embedding(sparse=True)``) are unscaled and checked
    through their values.

    Args:
        init_scale: The first scale.
        growth_factor: Multiplies the scale after ``growth_interval`` clean steps.
        backoff_factor: Multiplies the scale after an overflow.
        growth_interval: Clean steps between growths.
        min_scale: The scale never goes below this.
        dynamic: ``False`` keeps ``init_scale`` forever (steps with overflow are still
            skipped).
        hysteresis: Overflowed steps tolerated before the scale backs off (1: at once).
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
        hysteresis: int = 1,
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
        if isinstance(hysteresis, bool) or not isinstance(hysteresis, int) or hysteresis < 1:
            raise OffloadConfigError(
                f"offload: LossScaler needs hysteresis >= 1 (overflowed steps before the scale "
                f"backs off), got {hysteresis!r}; pass 1 to back off at every overflow."
            )
        self.scale = float(init_scale)
        self.hysteresis = hysteresis
        self._tolerated = hysteresis
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
            values = grad._values() if grad.is_sparse else grad
            ok = torch.isfinite(values).all()
            previous = finite.get(grad.device)
            finite[grad.device] = ok if previous is None else previous & ok
        return not all(bool(flag) for flag in finite.values())

    def update(self, found_inf: bool) -> None:
        """Adjust the scale after a step (dynamic scaling only)."""
        if not self.dynamic:
            return
        if found_inf:
            self._clean_steps = 0
            self._tolerated -= 1
            if self._tolerated <= 0:
                self.scale = max(self.scale * self.backoff_factor, self.min_scale)
                self._tolerated = self.hysteresis
            return
        self._clean_steps += 1
        if self._clean_steps >= self.growth_interval:
            self.scale *= self.growth_factor
            self._clean_steps = 0
            self._tolerated = self.hysteresis

    def state_dict(self) -> dict[str, Any]:
        """Return the scale, the growth counter and the overflows still tolerated."""
        return {
            "scale": self.scale,
            "clean_steps": self._clean_steps,
            "tolerated": self._tolerated,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned.

        Raises:
            offload.OffloadConfigError: ``state`` lacks a key or holds a scale that is not a
                positive finite number (training would skip every step), or a negative
                counter. Nothing is changed then.
        """
        if not isinstance(state, dict):
            raise OffloadConfigError(
                f"offload: LossScaler.load_state_dict needs the dict that state_dict() "
                f"returned, got {type(state).__name__}."
            )
        missing = [key for key in ("scale", "clean_steps") if key not in state]
        if missing:
            raise OffloadConfigError(
                f"offload: the loss scaler state lacks {', '.join(map(repr, missing))} (it has "
                f"{sorted(state)!r}); pass the dict LossScaler.state_dict() returned."
            )
        try:
            scale = float(state["scale"])
            clean_steps = int(state["clean_steps"])
            tolerated = int(state.get("tolerated", self.hysteresis))
        except (TypeError, ValueError) as exc:
            raise OffloadConfigError(
                f"offload: the loss scaler state holds a value that is not a number ({exc}); "
                "pass the dict LossScaler.state_dict() returned."
            ) from exc
        if not (math.isfinite(scale) and scale > 0) or clean_steps < 0 or tolerated < 1:
            raise OffloadConfigError(
                f"offload: the loss scaler state is invalid (scale={scale!r}, "
                f"clean_steps={clean_steps}, tolerated={tolerated}): the scale must be a "
                "positive finite number (a NaN, zero or negative scale skips every step) and "
                "the counters non-negative. Load a state saved by LossScaler.state_dict()."
            )
        self.scale = scale
        self._clean_steps = clean_steps
        self._tolerated = min(tolerated, self.hysteresis)

    def __repr__(self) -> str:
        kind = "dynamic" if self.dynamic else "static"
        return f"LossScaler({kind}, scale={self.scale:g})"
