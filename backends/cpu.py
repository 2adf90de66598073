"""The ``cpu`` backend: always available, synchronous, and the fallback of auto-detection."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch

from accel import Availability, BackendSpec, hookimpl

from ._common import autocast_kwargs_for, checked_index, forked_rng
from ._null import WithoutDeviceMemory, WithoutStreams

__all__ = ["CpuBackend", "accel_backends"]


class CpuBackend(WithoutStreams, WithoutDeviceMemory):
    """Runs on the host CPU.

    There is one device (index 0). Work is synchronous, so streams and events are
    :class:`~backends._null.NullStream` and :class:`~backends._null.NullEvent` objects
    that complete at once; ``mark_step`` does nothing; ``pin_memory`` returns its input,
    as :attr:`supports_pinned_memory` says; memory statistics are not tracked and read 0.

    Subclass it to build a CPU-based backend of your own (see ``examples/``).
    """

    name = "cpu"
    device_type = "cpu"
    is_lazy = False
    is_asynchronous = False
    communication_backend = "gloo"

    def device(self, index: int | None = None) -> torch.device:
        """Return ``torch.device("cpu")``; only index 0 (or ``None``) is valid."""
        if index is not None:
            checked_index(self.name, index, 1)
        return torch.device("cpu")

    def device_count(self) -> int:
        """Return 1: the host is one device."""
        return 1

    def current_device(self) -> int:
        """Return 0."""
        return 0

    def set_device(self, index: int) -> None:
        """Accept index 0; any other index raises :class:`accel.DeviceIndexError`."""
        checked_index(self.name, index, 1)

    def is_available(self) -> bool:
        """Return ``True``."""
        return True

    def synchronize(self) -> None:
        """Return at once: CPU work is synchronous."""

    def mark_step(self) -> None:
        """Do nothing: the CPU runs eagerly."""

    def manual_seed(self, seed: int) -> None:
        """Seed the CPU generator."""
        torch.manual_seed(seed)

    def get_rng_state(self) -> torch.Tensor:
        """Return the CPU generator state."""
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        """Restore the CPU generator state."""
        torch.set_rng_state(state)

    def fork_rng(self, enabled: bool = True) -> AbstractContextManager[None]:
        """Return a context that restores the CPU generator on exit."""
        return forked_rng(enabled, self.get_rng_state, self.set_rng_state)

    def autocast_kwargs(self) -> dict[str, Any]:
        """Return the current CPU autocast state as ``torch.autocast`` keywords."""
        return autocast_kwargs_for(self.device_type)

    def empty_cache(self) -> None:
        """Do nothing: the CPU allocator keeps no device cache."""

    def is_bf16_supported(self) -> bool:
        """Return ``True``: torch computes bfloat16 on every CPU."""
        return True

    def is_fp16_supported(self) -> bool:
        """Return ``True``: torch computes float16 on every CPU (slowly on old ones)."""
        return True

    def prepare_distributed(self) -> None:
        """Do nothing: gloo needs no preparation."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def _probe() -> Availability:
    return Availability(available=True, device_count=1)


@hookimpl
def accel_backends() -> Sequence[BackendSpec]:
    """Provide the ``cpu`` backend."""
    return [
        BackendSpec(
            name="cpu",
            factory=CpuBackend,
            probe=_probe,
            description="Host CPU (synchronous; the fallback when no accelerator is found).",
            priority=0,
        )
    ]
