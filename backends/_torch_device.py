"""The one home of accel's CUDA-style device code: a device driven through a torch module.

``torch.cuda``, ``torch.xpu`` and the module a PrivateUse1 vendor registers
(``torch.npu``, ``torch.musa``, PyTorch's reference ``torch.openreg``) share the same
shape: device count and index, per-device generators, streams, events, memory
statistics, pinned host memory. One class serves them all. Each member asks the device
module first and, where the module lacks the function, ``torch.accelerator`` (torch 2.6
and later; memory members from 2.9) and the generic ``torch.Stream``/``torch.Event``.
The ``cuda`` and ``xpu`` backends only name their module and communication backend;
the generic PrivateUse1 backend (:mod:`backends.privateuse1`) finds its capabilities
out instead of declaring them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from types import ModuleType
from typing import Any

import torch

from accel import _compat

from ._common import autocast_kwargs_for, checked_index, forked_rng
from ._generic_streams import GenericEvent, GenericStream, stream_context

__all__ = ["TorchDeviceBackend"]


class TorchDeviceBackend:
    """An asynchronous device with real streams, pinned host memory and memory stats."""

    name: str
    device_type: str
    communication_backend: str
    is_lazy = False
    is_asynchronous = True
    supports_streams = True
    # One copy stream, overlapping compute: what every device with streams can do.
    # A device whose host-to-device and device-to-host copies overlap says 2.
    copy_engines = 1
    supports_pinned_memory = True
    supports_memory_stats = True
    compile_backend = "inductor"

    def __init__(self, module: ModuleType) -> None:
        self._module = module

    def _function(self, name: str) -> Callable[..., Any] | None:
        """The device module's ``name``, else ``torch.accelerator``'s, else ``None``."""
        found = getattr(self._module, name, None)
        return found if callable(found) else _compat.accelerator_function(name)

    def _required(self, name: str) -> Callable[..., Any]:
        function = self._function(name)
        if function is None:
            raise NotImplementedError(
                f"{self.name}: neither torch.{self.device_type} nor torch.accelerator (torch "
                f"{torch.__version__}) has {name}(); upgrade torch, or install an accel plugin "
                f"for {self.device_type!r} that provides it."
            )
        return function

    @property
    def Stream(self) -> Any:
        """The device module's stream class, else a maker of generic ``torch.Stream``."""
        own = getattr(self._module, "Stream", None)
        return own if own is not None else GenericStream(self.device)

    @property
    def Event(self) -> Any:
        """The device module's event class, else a maker of generic ``torch.Event``."""
        own = getattr(self._module, "Event", None)
        return own if own is not None else GenericEvent(self.device_type)

    def device(self, index: int | None = None) -> torch.device:
        """Return ``torch.device(type, index)``; ``None`` is the current device.

        Does not initialise the device: before initialisation the current device is 0.
        An explicit index is checked against :meth:`device_count` (same conditions).
        """
        if index is None:
            index = self._module.current_device() if self._initialized() else 0
        else:
            checked_index(self.name, index, self.device_count())
        return torch.device(self.device_type, index)

    def _initialized(self) -> bool:
        check = getattr(self._module, "is_initialized", None)
        # A module without is_initialized cannot say; asking for the current device is
        # then the only way to know it (the module contract requires current_device).
        return bool(check()) if callable(check) else True

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
        checked = checked_index(self.name, index, self.device_count())
        own = getattr(self._module, "set_device", None)
        if callable(own):
            own(checked)
        else:
            self._required("set_device_index")(checked)

    def is_available(self) -> bool:
        """Return whether a device is visible (counted as :meth:`device_count` counts)."""
        return self.device_count() > 0

    def synchronize(self) -> None:
        """Wait for all work on the current device."""
        self._required("synchronize")()

    def mark_step(self) -> None:
        """Do nothing: this device runs eagerly."""

    def manual_seed(self, seed: int) -> None:
        """Seed the current device's generator.

        A module without ``manual_seed`` (the PrivateUse1 contract requires only
        ``manual_seed_all``) seeds every device's generator.
        """
        own = getattr(self._module, "manual_seed", None)
        (own if callable(own) else self._module.manual_seed_all)(seed)

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

        ``devices=None`` means the current device. The CPU generator is restored too, so
        a device whose random operators draw from it is covered as well.
        """
        return forked_rng(enabled, self.get_rng_state, self.set_rng_state, devices)

    def autocast_kwargs(self) -> dict[str, Any]:
        """Return the current autocast state of this device as ``torch.autocast`` keywords."""
        return autocast_kwargs_for(self.device_type)

    def current_stream(self) -> Any:
        """Return the current stream of the current device."""
        own = getattr(self._module, "current_stream", None)
        if callable(own):
            return own()
        return self._required("current_stream")(self.device())

    def stream(self, stream: Any) -> AbstractContextManager[Any]:
        """Return a context that queues work on ``stream``."""
        own = getattr(self._module, "stream", None)
        if callable(own):
            context: AbstractContextManager[Any] = own(stream)
            return context
        return stream_context(stream)

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None:
        """Keep ``tensor``'s memory from reuse until work queued on ``stream`` is done."""
        tensor.record_stream(stream)

    def memory_allocated(self) -> int:
        """Return bytes held by tensors on the current device."""
        return int(self._required("memory_allocated")())

    def max_memory_allocated(self) -> int:
        """Return the peak of :meth:`memory_allocated` since the last reset."""
        return int(self._required("max_memory_allocated")())

    def reset_peak_memory_stats(self) -> None:
        """Start a new peak."""
        self._required("reset_peak_memory_stats")()

    def empty_cache(self) -> None:
        """Release cached blocks that no tensor uses."""
        self._required("empty_cache")()

    def pin_memory(self, tensor: torch.Tensor) -> torch.Tensor:
        """Return ``tensor`` in page-locked memory (itself if already pinned)."""
        return _compat.pin_memory(tensor, self.device_type)

    def empty_pinned(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """Return a new page-locked host tensor, allocated pinned (no pageable copy)."""
        # torch.empty(pin_memory=True) finds the device's host allocator itself: CUDA
        # first, then (2.4 to 2.8) the other built-in hooks and PrivateUse1's, from 2.9
        # the current accelerator's.
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
