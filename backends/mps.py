"""The ``mps`` backend: Apple GPUs through ``torch.mps``.

MPS has one device and no user-visible streams, so streams and events are the null
objects the CPU uses; torch offers no peak-memory statistics for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch

from accel import Availability, BackendSpec, hookimpl

from ._common import autocast_kwargs_for, checked_index, forked_rng
from ._null import WithoutDeviceMemory, WithoutStreams

__all__ = ["MpsBackend", "accel_backends"]


class MpsBackend(WithoutStreams, WithoutDeviceMemory):
    """Apple-silicon GPU; one device, no concurrent streams, ``gloo`` for communication."""

    name = "mps"
    device_type = "mps"
    is_lazy = False
    is_asynchronous = True
    communication_backend = "gloo"

    def device(self, index: int | None = None) -> torch.device:
        """Return ``torch.device("mps", 0)``; only index 0 is valid."""
        return torch.device("mps", 0 if index is None else checked_index(self.name, index, 1))

    def device_count(self) -> int:
        """Return 1 where MPS is available, else 0."""
        return 1 if torch.backends.mps.is_available() else 0

    def current_device(self) -> int:
        """Return 0."""
        return 0

    def set_device(self, index: int) -> None:
        """Accept index 0 only."""
        checked_index(self.name, index, 1)

    def is_available(self) -> bool:
        """Return whether the Metal device is usable."""
        return bool(torch.backends.mps.is_available())

    def synchronize(self) -> None:
        """Wait for all queued Metal work."""
        torch.mps.synchronize()

    def mark_step(self) -> None:
        """Do nothing: MPS runs eagerly."""

    def manual_seed(self, seed: int) -> None:
        """Seed the MPS generator."""
        torch.mps.manual_seed(seed)

    def get_rng_state(self) -> torch.Tensor:
        """Return the MPS generator state."""
        return torch.mps.get_rng_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        """Restore the MPS generator state."""
        torch.mps.set_rng_state(state)

    def fork_rng(self, enabled: bool = True) -> AbstractContextManager[None]:
        """Return a context that restores the CPU and MPS generators on exit."""
        return forked_rng(enabled, self.get_rng_state, self.set_rng_state)

    def autocast_kwargs(self) -> dict[str, Any]:
        """Return the current MPS autocast state as ``torch.autocast`` keywords."""
        return autocast_kwargs_for(self.device_type)

    def empty_cache(self) -> None:
        """Release cached Metal buffers."""
        torch.mps.empty_cache()

    def is_bf16_supported(self) -> bool:
        """Return ``True``: torch supports bfloat16 on MPS since macOS 14."""
        return True

    def is_fp16_supported(self) -> bool:
        """Return ``True``."""
        return True

    def prepare_distributed(self) -> None:
        """Do nothing."""

    def __repr__(self) -> str:
        return "MpsBackend(name='mps')"


def _probe() -> Availability:
    if not torch.backends.mps.is_built():
        return Availability.unavailable(
            "no MPS device is visible: this torch build has no MPS support (MPS exists only "
            "on macOS builds for Apple silicon)."
        )
    if not torch.backends.mps.is_available():
        return Availability.unavailable(
            "no MPS device is visible: torch.backends.mps.is_available() is false; MPS needs "
            "macOS 12.3+ on Apple silicon."
        )
    return Availability(available=True, device_count=1)


@hookimpl
def accel_backends() -> Sequence[BackendSpec]:
    """Provide the ``mps`` backend."""
    return [
        BackendSpec(
            name="mps",
            factory=MpsBackend,
            probe=_probe,
            description="Apple-silicon GPUs via torch.mps.",
            priority=100,
        )
    ]
