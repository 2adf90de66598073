"""The ``cpu`` backend: always available, synchronous, and the fallback of auto-detection."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from accel import BackendSpec, hookimpl

from ._common import checked_index, one_host_device
from ._single import SingleDeviceBackend

__all__ = ["CpuBackend", "accel_backends"]


class CpuBackend(SingleDeviceBackend):
    """Runs on the host CPU.

    There is one device, ``torch.device("cpu")``. Work is synchronous, so streams and
    events are null objects that complete at once; ``mark_step`` does nothing;
    ``pin_memory`` returns its input, as :attr:`supports_pinned_memory` says; torch keeps
    no CPU allocation statistics, so the memory figures read 0. The device generator is
    the CPU generator.

    Subclass it to build a CPU-based backend of your own (see ``examples/``).
    """

    name = "cpu"
    device_type = "cpu"
    the_device = torch.device("cpu")
    is_asynchronous = False

    def is_available(self) -> bool:
        """Return ``True``."""
        return True

    def synchronize(self) -> None:
        """Return at once: CPU work is synchronous."""

    def manual_seed(self, seed: int) -> None:
        """Seed the CPU generator."""
        torch.manual_seed(seed)

    def get_rng_state(self, index: int | None = None) -> torch.Tensor:
        """Return the CPU generator state (``index`` 0 or ``None``: there is one device)."""
        if index is not None:
            checked_index(self.name, index, 1)
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor, index: int | None = None) -> None:
        """Restore the CPU generator state (``index`` 0 or ``None``)."""
        if index is not None:
            checked_index(self.name, index, 1)
        torch.set_rng_state(state)

    def empty_cache(self) -> None:
        """Do nothing: the CPU allocator keeps no device cache."""


@hookimpl
def accel_backends() -> Sequence[BackendSpec]:
    """Provide the ``cpu`` backend."""
    return [
        BackendSpec(
            name="cpu",
            factory=CpuBackend,
            probe=one_host_device,
            description="Host CPU (synchronous; the fallback when no accelerator is found).",
            priority=0,
        )
    ]
