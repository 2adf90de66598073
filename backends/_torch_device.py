"""A backend over one of torch's built-in device modules with the CUDA-style API.

``torch.cuda`` and ``torch.xpu`` expose the same functions (streams, events, memory
statistics, per-device generators), so one class serves both; the subclasses only name
the module and the communication backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from types import ModuleType
from typing import Any

import torch

from ._common import autocast_kwargs_for, checked_index, forked_rng

__all__ = ["TorchDeviceBackend"]


class TorchDeviceBackend:
    """An asynchronous device with real streams, pinned host memory and memory stats."""

    name: str
    device_type: str
    communication_backend: str
    is_lazy = False
    is_asynchronous = True
    supports_streams = True
    supports_pinned_memory = True
    supports_memory_stats = True
    compile_backend = "inductor"

    def __init__(self, module: ModuleType) -> None:
        self._module = module

    @property
    def Stream(self) -> Any:
        """The device module's stream class."""
        return self._module.Stream

    @property
    def Event(self) -> Any:
        """The device module's event class."""
        return self._module.Event

    def device(self, index: int | None = None) -> torch.device:
        """Return ``torch.device(type, index)``; ``None`` is the current device.

        Does not initialise the device: before initialisation the current device is 0.
        An explicit index is checked against :meth:`device_count` (same conditions).
        """
        if index is None:
            index = self._module.current_device() if self._module.is_initialized() else 0
        else:
            checked_index(self.name, index, self.device_count())
        return torch.device(self.device_type, index)

    def device_count(self) -> int:
        """Return the visible device count; each index below it is usable.

        Initialises nothing where torch can count without the runtime (CUDA: NVML works
        and no MIG UUIDs are visible; XPU: ``pyzes`` is installed); see the subclass's
        module for the conditions.
        """
        return int(self._module.device_count())

    def current_device(self) -> int:
        """Return the current device index (initialises the device)."""
        return int(self._module.current_device())

    def set_device(self, index: int) -> None:
        """Make ``index`` current; :class:`accel.DeviceIndexError` if it is not visible."""
        self._module.set_device(checked_index(self.name, index, self.device_count()))

    def is_available(self) -> bool:
        """Return whether a device is visible (counted as :meth:`device_count` counts)."""
        return self.device_count() > 0

    def synchronize(self) -> None:
        """Wait for all work on the current device."""
        self._module.synchronize()

    def mark_step(self) -> None:
        """Do nothing: this device runs eagerly."""

    def manual_seed(self, seed: int) -> None:
        """Seed the current device's generator."""
        self._module.manual_seed(seed)

    def get_rng_state(self, index: int | None = None) -> torch.Tensor:
        """Return the generator state of device ``index`` (default: the current device)."""
        if index is None:
            state: torch.Tensor = self._module.get_rng_state()
        else:
            state = self._module.get_rng_state(checked_index(self.name, index, self.device_count()))
        return state

    def set_rng_state(self, state: torch.Tensor, index: int | None = None) -> None:
        """Restore the generator state of device ``index`` (default: the current device)."""
        if index is None:
            self._module.set_rng_state(state)
        else:
            self._module.set_rng_state(state, checked_index(self.name, index, self.device_count()))

    def fork_rng(
        self, enabled: bool = True, devices: Sequence[int] | None = None
    ) -> AbstractContextManager[None]:
        """Return a context that restores the CPU generator and those of ``devices`` on exit.

        ``devices=None`` means the current device.
        """
        return forked_rng(enabled, self.get_rng_state, self.set_rng_state, devices)

    def autocast_kwargs(self) -> dict[str, Any]:
        """Return the current autocast state of this device as ``torch.autocast`` keywords."""
        return autocast_kwargs_for(self.device_type)

    def current_stream(self) -> Any:
        """Return the current stream of the current device."""
        return self._module.current_stream()

    def stream(self, stream: Any) -> AbstractContextManager[Any]:
        """Return a context that queues work on ``stream``."""
        context: AbstractContextManager[Any] = self._module.stream(stream)
        return context

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None:
        """Keep ``tensor``'s memory from reuse until work queued on ``stream`` is done."""
        tensor.record_stream(stream)

    def memory_allocated(self) -> int:
        """Return bytes held by tensors on the current device."""
        return int(self._module.memory_allocated())

    def max_memory_allocated(self) -> int:
        """Return the peak of :meth:`memory_allocated` since the last reset."""
        return int(self._module.max_memory_allocated())

    def reset_peak_memory_stats(self) -> None:
        """Start a new peak."""
        self._module.reset_peak_memory_stats()

    def empty_cache(self) -> None:
        """Release cached blocks that no tensor uses."""
        self._module.empty_cache()

    def pin_memory(self, tensor: torch.Tensor) -> torch.Tensor:
        """Return ``tensor`` in page-locked memory (itself if already pinned)."""
        return tensor if tensor.is_pinned() else tensor.pin_memory()

    def empty_pinned(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """Return a new page-locked host tensor, allocated pinned (no pageable copy)."""
        return torch.empty(tuple(shape), dtype=dtype, pin_memory=True)

    def is_bf16_supported(self) -> bool:
        """Return whether the current device computes in bfloat16."""
        return bool(self._module.is_bf16_supported())

    def is_fp16_supported(self) -> bool:
        """Return ``True``: every device of this kind computes in float16."""
        return True

    def prepare_distributed(self) -> None:
        """Do nothing: the communication backend needs no preparation."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
