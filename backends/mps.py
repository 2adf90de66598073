"""The ``mps`` backend: Apple GPUs through ``torch.mps``.

MPS has one device and no user-visible streams, so streams and events are the null
objects the CPU uses; torch offers no peak-memory statistics for it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from accel import Availability, BackendSpec, hookimpl

from ._common import checked_index
from ._single import SingleDeviceBackend

__all__ = ["MpsBackend", "accel_backends"]


class MpsBackend(SingleDeviceBackend):
    """Apple-silicon GPU; one device, no concurrent streams, ``gloo`` for communication."""

    name = "mps"
    device_type = "mps"
    the_device = torch.device("mps", 0)
    is_asynchronous = True
    # Inductor's Metal code generation only exists in recent torch releases; aot_eager
    # compiles on every supported one.
    compile_backend = "aot_eager"

    def device_count(self) -> int:
        """Return 1 where MPS is available, else 0."""
        return 1 if self.is_available() else 0

    def is_available(self) -> bool:
        """Return whether the Metal device is usable."""
        return bool(torch.backends.mps.is_available())

    def synchronize(self) -> None:
        """Wait for all queued Metal work."""
        torch.mps.synchronize()

    def manual_seed(self, seed: int) -> None:
        """Seed the MPS generator."""
        torch.mps.manual_seed(seed)

    def get_rng_state(self, index: int | None = None) -> torch.Tensor:
        """Return the MPS generator state (``index`` 0 or ``None``)."""
        if index is not None:
            checked_index(self.name, index, 1)
        return torch.mps.get_rng_state()

    def set_rng_state(self, state: torch.Tensor, index: int | None = None) -> None:
        """Restore the MPS generator state (``index`` 0 or ``None``)."""
        if index is not None:
            checked_index(self.name, index, 1)
        torch.mps.set_rng_state(state)

    def empty_cache(self) -> None:
        """Release cached Metal buffers."""
        torch.mps.empty_cache()


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
