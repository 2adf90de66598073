"""A base for backends with exactly one device, no user-visible streams and host memory."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import torch

from ._common import autocast_kwargs_for, checked_index, forked_rng
from ._null import WithoutDeviceMemory, WithoutStreams

__all__ = ["SingleDeviceBackend"]


class SingleDeviceBackend(WithoutStreams, WithoutDeviceMemory, ABC):
    """One device (index 0), null streams and events, no pinned memory, ``gloo``.

    Subclasses set ``name``, ``device_type``, ``is_asynchronous`` and ``the_device``, and
    implement availability, synchronisation, the generator and ``empty_cache``.
    """

    name: ClassVar[str]
    device_type: ClassVar[str]
    the_device: ClassVar[torch.device]
    is_lazy = False
    communication_backend = "gloo"
    compile_backend: ClassVar[str] = "inductor"

    def device(self, index: int | None = None) -> torch.device:
        """Return the one device; only index 0 (or ``None``) is valid."""
        if index is not None:
            checked_index(self.name, index, 1)
        return self.the_device

    def device_count(self) -> int:
        """Return 1."""
        return 1

    def current_device(self) -> int:
        """Return 0."""
        return 0

    def set_device(self, index: int) -> None:
        """Accept index 0; any other index raises :class:`accel.DeviceIndexError`."""
        checked_index(self.name, index, 1)

    def mark_step(self) -> None:
        """Do nothing: the device runs eagerly."""

    @abstractmethod
    def is_available(self) -> bool:
        """Return whether the device is usable."""

    @abstractmethod
    def synchronize(self) -> None:
        """Wait for all queued work."""

    @abstractmethod
    def manual_seed(self, seed: int) -> None:
        """Seed the device generator."""

    @abstractmethod
    def get_rng_state(self, index: int | None = None) -> torch.Tensor:
        """Return the device generator state (``index`` 0 or ``None``)."""

    @abstractmethod
    def set_rng_state(self, state: torch.Tensor, index: int | None = None) -> None:
        """Restore the device generator state (``index`` 0 or ``None``)."""

    @abstractmethod
    def empty_cache(self) -> None:
        """Release cached device memory where the device keeps any."""

    def fork_rng(
        self, enabled: bool = True, devices: Sequence[int] | None = None
    ) -> AbstractContextManager[None]:
        """Return a context that restores the CPU and device generators on exit."""
        if devices is not None:
            for index in devices:
                checked_index(self.name, index, 1)
        return forked_rng(enabled, self.get_rng_state, self.set_rng_state, devices)

    def autocast_kwargs(self) -> dict[str, Any]:
        """Return the current autocast state of this device as ``torch.autocast`` keywords."""
        return autocast_kwargs_for(self.device_type)

    def is_bf16_supported(self) -> bool:
        """Return ``True``: torch computes bfloat16 on these devices."""
        return True

    def is_fp16_supported(self) -> bool:
        """Return ``True``: torch computes float16 on these devices."""
        return True

    def prepare_distributed(self) -> None:
        """Do nothing: gloo needs no preparation."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
