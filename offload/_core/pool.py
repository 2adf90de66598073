"""Device memory kept across steps and handed out again: no allocation after the first step.

A wrapper whose units are not all the same size (:func:`offload.offload_parameters`, the
copies of the ``"copy-parameters"`` strategy) cannot lay out fixed buffers in advance.
:class:`DevicePool` keeps every flat device tensor it ever allocated and hands one out
again (the smallest that is large enough) once nobody else holds its memory: what it
gives out is always a view, so a caller still holding it, or anything viewing it (a
tensor autograd saved), keeps it from being handed out. The pool therefore grows to the
most memory in use at once, in the first step, and allocates nothing afterwards.

Memory handed back is also ordered on the device: :meth:`DevicePool.release` records
the events after its last uses, and the stream that takes it next waits for them (for
everything queued on the compute stream, when nothing was recorded).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from accel import _compat

from .transfer import Transfers

__all__ = ["DevicePool", "Stream"]

Stream = Literal["load", "compute"]


@dataclass
class _Held:
    """One flat device tensor of the pool, and the events after its last uses."""

    tensor: torch.Tensor
    events: list[Any] = field(default_factory=list)


class DevicePool:
    """Flat device tensors by dtype, reused once no one else holds them.

    Args:
        transfers: The copy streams (whose load stream waits before reusing memory).
        device: Where to allocate.
    """

    def __init__(self, transfers: Transfers, device: torch.device) -> None:
        self._transfers = transfers
        self._device = device
        self._held: list[_Held] = []

    @property
    def nbytes(self) -> int:
        """Device bytes the pool holds, in use or not."""
        return sum(h.tensor.numel() * h.tensor.element_size() for h in self._held)

    def take(self, dtype: torch.dtype, numel: int, *, stream: Stream = "load") -> torch.Tensor:
        """Return a view of ``numel`` elements of ``dtype`` (contents undefined).

        Call it on the stream that will use the memory first: the load stream (inside
        :meth:`offload._core.transfer.Transfers.on_copy_stream`) or the current, compute
        stream. That stream waits, before it uses reused memory, for the events recorded by
        :meth:`release` (or, when none were, for everything queued on the compute stream).
        """
        numel = max(numel, 1)
        free = [
            held
            for held in self._held
            if held.tensor.dtype == dtype
            and held.tensor.numel() >= numel
            and _compat.sole_owner(held.tensor)
        ]
        if free:
            held = min(free, key=lambda h: h.tensor.numel())
            if stream == "compute":
                for event in held.events:
                    self._transfers.compute_waits(event)
            elif held.events:
                for event in held.events:
                    self._transfers.copy_waits(event)
            else:
                self._transfers.copy_waits_for_compute()
            held.events = []
        else:
            held = _Held(torch.empty(numel, dtype=dtype, device=self._device))
            self._held.append(held)
        return held.tensor[:numel]

    def release(self, view: torch.Tensor, events: Sequence[Any]) -> None:
        """Note that ``view``'s memory is last used by the work before ``events``.

        The caller then drops ``view``; the memory is handed out again once every other
        view of it is gone too.
        """
        pointer = view.untyped_storage().data_ptr()
        for held in self._held:
            if held.tensor.untyped_storage().data_ptr() == pointer:
                held.events = [event for event in events if event is not None]
                return

    def clear(self) -> None:
        """Forget every tensor (each is freed when its last view is)."""
        self._held.clear()
