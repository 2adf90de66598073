"""The generic backend for the device torch has registered through PrivateUse1.

A vendor whose accelerator joins PyTorch the way PyTorch asks new ones to (a PrivateUse1
device renamed after itself, a device module registered as ``torch.<name>``, loaded at
``import torch`` from the ``torch.backends`` entry point on torch 2.5 and later) gets a
backend named after its device with no accel plugin: ``get_backend("<name>")``,
``ACCEL=<name>``, and auto-detection when torch says the device is available.

Everything comes from public torch API (the device module, ``torch.accelerator``, the
generic ``torch.Stream``/``torch.Event``, ``torch.distributed``'s device map), and what
the device can do is found out, not assumed:

* **memory statistics**: asked once; a device whose allocator does not answer (torch
  asserts "Allocator for <name> is not a DeviceAllocator") reports none, and the
  memory figures read 0;
* **pinned host memory**: one page-locked byte is allocated and checked;
* **streams and events**: the module's own, else ``torch.Stream``/``torch.Event`` with
  ``torch.accelerator``'s current stream (torch 2.6+), else none;
* **communication backend**: the one ``torch.distributed`` maps the device to; where
  there is none, :attr:`PrivateUse1Backend.communication_backend` is ``"undefined"``
  and :meth:`~PrivateUse1Backend.prepare_distributed` raises a sentence saying so;
* **random numbers**: the device module's generators; where the device's random
  operators draw from the CPU generator instead, :meth:`~PrivateUse1Backend.manual_seed`
  seeds that one too (``fork_rng`` always restores it, so checkpointing replays the
  same dropout masks either way);
* **dtypes**: the module's ``is_bf16_supported`` where it has one, else torch's
  device capability (2.10+), else a small computation in the dtype.

What an accel plugin for the device still adds: a lazy device's ``mark_step`` and
recompute barrier, and counting devices without initialising one (this backend counts
with the module's ``device_count()``, which initialises what the vendor's does). A
plugin that offers the same name, or declares the device type in its
:class:`accel.BackendSpec`, takes precedence over this backend.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch

from accel import Availability, BackendSpec, DistributedSetupError, _compat, hookimpl

from ._generic_streams import DeferredRelease, generic_streams_available
from ._null import NullEvent, NullStream, null_stream_context
from ._torch_device import TorchDeviceBackend

__all__ = [
    "PRIORITY",
    "UNDEFINED_COMMUNICATION",
    "UNREGISTERED_NAME",
    "PrivateUse1Backend",
    "accel_backends",
    "registered_device",
]

UNREGISTERED_NAME = "privateuse1"
"""The name the listing shows while no device has joined torch through PrivateUse1."""
PRIORITY = 225
"""Auto-detection priority: below ``hpu``, above ``cuda`` (torch prefers such a device too)."""
UNDEFINED_COMMUNICATION = "undefined"
"""``torch.distributed.Backend.UNDEFINED``: the communication backend of a device torch maps
to none."""


def registered_device() -> str | None:
    """Return the device type a vendor registered through PrivateUse1, or ``None``."""
    return _compat.privateuse1_device_type()


class PrivateUse1Backend(TorchDeviceBackend):
    """The PrivateUse1 device torch has registered, through its device module.

    Args:
        device_type: The registered device type (default: the one torch has).

    Raises:
        RuntimeError: No device is registered through PrivateUse1, or it has no device
            module.
    """

    compile_backend = "aot_eager"

    def __init__(self, device_type: str | None = None) -> None:
        found = registered_device() if device_type is None else device_type
        if found is None:
            raise RuntimeError(_not_registered())
        module = getattr(torch, found, None)
        if module is None:
            raise RuntimeError(_no_module(found))
        super().__init__(module)
        self.name = found
        self.device_type = found
        self._memory_stats: bool | None = None
        self._pinned: bool | None = None
        self._dtypes: dict[torch.dtype, bool] = {}
        self._draws_from_cpu: bool | None = None
        self._has_streams = hasattr(module, "Stream") or generic_streams_available()
        self._allocator_records: bool | None = None
        self._deferred = DeferredRelease()

    # Capabilities, found out on first use -----------------------------------------------

    @property
    def supports_streams(self) -> bool:  # type: ignore[override]
        """Whether the module or torch's generic stream API gives streams for the device."""
        return self._has_streams

    @property
    def copy_engines(self) -> int:  # type: ignore[override]
        """2 with streams (each runs on its own, as torch's stream API promises), else 0."""
        return 2 if self._has_streams else 0

    @property
    def supports_memory_stats(self) -> bool:  # type: ignore[override]
        """Whether the device answers ``memory_allocated`` (asked once; may initialise it)."""
        if self._memory_stats is None:
            function = self._function("memory_allocated")
            try:
                self._memory_stats = function is not None and int(function()) >= 0
            except Exception:  # torch's internal assert for a non-DeviceAllocator, or others
                self._memory_stats = False
        return self._memory_stats

    @property
    def supports_pinned_memory(self) -> bool:  # type: ignore[override]
        """Whether host memory can be page-locked for the device (one byte is tried)."""
        if self._pinned is None:
            try:
                probe = torch.empty(1, dtype=torch.uint8, pin_memory=True)
                self._pinned = bool(probe.is_pinned())
            except Exception:  # no host allocator for this device
                self._pinned = False
        return self._pinned

    @property
    def communication_backend(self) -> str:  # type: ignore[override]
        """The ``torch.distributed`` backend torch maps the device to, else ``"undefined"``.

        Read when asked, so a backend the vendor registers later is found. Where there is
        none it is torch's ``Backend.UNDEFINED``, and :meth:`prepare_distributed` raises.
        """
        found = _compat.default_communication_backend(self.device_type)
        return UNDEFINED_COMMUNICATION if found is None else found

    def prepare_distributed(self) -> None:
        """Check that torch has a communication backend for the device.

        Raises:
            accel.DistributedSetupError: It has none; the message says what to do.
        """
        if _compat.default_communication_backend(self.device_type) is None:
            raise DistributedSetupError(self._no_communication_backend())

    def _no_communication_backend(self) -> str:
        return (
            f"{self.name}: torch.distributed has no communication backend for "
            f"{self.device_type!r} devices (torch.distributed.Backend."
            "default_device_backend_map has no entry for it), so distributed training on "
            "this device is not possible here. Install or import the vendor's collective "
            "library, which registers one with torch.distributed.Backend.register_backend("
            f"..., devices=[{self.device_type!r}]), or train in one process."
        )

    def manual_seed(self, seed: int) -> None:
        """Seed the current device's generator, and the CPU's where random ops draw from it.

        Some devices run random operators through a CPU fallback that draws from the CPU
        generator, not the device's (found out once: one random number is drawn on the
        device, and both generators are put back). There, seeding the device means
        seeding the CPU generator too, or the same seed would not give the same dropout.
        """
        super().manual_seed(seed)
        if self.random_ops_draw_from_cpu():
            torch.default_generator.manual_seed(seed)

    def random_ops_draw_from_cpu(self) -> bool:
        """Whether random operators on the device advance the CPU generator (found once)."""
        if self._draws_from_cpu is None:
            index = self.current_device()
            cpu_state = torch.get_rng_state()
            device_state = self.get_rng_state(index)
            try:
                torch.rand(1, device=self.device(index))
                self._draws_from_cpu = not torch.equal(torch.get_rng_state(), cpu_state)
            finally:
                torch.set_rng_state(cpu_state)
                self.set_rng_state(device_state, index)
        return self._draws_from_cpu

    def is_bf16_supported(self) -> bool:
        """Return whether the device computes in bfloat16 (found out once)."""
        return self._computes_in(torch.bfloat16, "is_bf16_supported")

    def is_fp16_supported(self) -> bool:
        """Return whether the device computes in float16 (found out once)."""
        return self._computes_in(torch.float16, "is_fp16_supported")

    def _computes_in(self, dtype: torch.dtype, own_query: str) -> bool:
        if dtype not in self._dtypes:
            self._dtypes[dtype] = self._find_dtype_support(dtype, own_query)
        return self._dtypes[dtype]

    def _find_dtype_support(self, dtype: torch.dtype, own_query: str) -> bool:
        own = getattr(self._module, own_query, None)
        if callable(own):
            return bool(own())
        capability = _compat.accelerator_function("get_device_capability")
        if capability is not None:
            try:
                return dtype in capability(self.device())["supported_dtypes"]
            except Exception:  # the device does not report capabilities: try it
                pass
        try:
            x = torch.ones(4, 4, dtype=dtype, device=self.device())
            return bool((x @ x).to("cpu", torch.float32).eq(4).all())
        except Exception:  # no kernel for the dtype
            return False

    # Streams, where the device has none --------------------------------------------------

    @property
    def Stream(self) -> Any:
        """Streams of the module or torch's generic ones; null streams where neither exists."""
        return super().Stream if self._has_streams else NullStream

    @property
    def Event(self) -> Any:
        """Events of the module or torch's generic ones; null events where neither exists."""
        return super().Event if self._has_streams else NullEvent

    def current_stream(self) -> Any:
        """Return the current stream (a null stream where the device has none)."""
        return super().current_stream() if self._has_streams else NullStream()

    def stream(self, stream: Any) -> AbstractContextManager[Any]:
        """Return a context that queues work on ``stream``."""
        return super().stream(stream) if self._has_streams else null_stream_context(stream)

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None:
        """Keep ``tensor``'s memory from reuse until the work queued on ``stream`` is done.

        Tells the allocator where the device has a ``record_stream`` kernel; elsewhere
        holds the storage until an event on ``stream`` completes
        (:class:`~backends._generic_streams.DeferredRelease`). Nothing to do without
        streams.
        """
        if not self._has_streams:
            return
        if self._allocator_records is not False:
            try:
                super().record_stream(tensor, stream)
            except (NotImplementedError, RuntimeError):
                if self._allocator_records:  # it worked before: a real error
                    raise
                self._allocator_records = False
            else:
                self._allocator_records = True
                return
        self._deferred.hold(tensor, stream)

    def synchronize(self) -> None:
        """Wait for all work on the current device."""
        super().synchronize()
        self._deferred.release_all()

    # Memory, where the device answers ---------------------------------------------------

    def memory_allocated(self) -> int:
        """Return bytes held by tensors on the current device (0 without statistics)."""
        return super().memory_allocated() if self.supports_memory_stats else 0

    def max_memory_allocated(self) -> int:
        """Return the peak since the last reset (0 without statistics)."""
        return super().max_memory_allocated() if self.supports_memory_stats else 0

    def reset_peak_memory_stats(self) -> None:
        """Start a new peak (nothing to do without statistics)."""
        if self.supports_memory_stats:
            super().reset_peak_memory_stats()

    def empty_cache(self) -> None:
        """Release cached device memory where the device's allocator answers."""
        if self.supports_memory_stats and self._function("empty_cache") is not None:
            super().empty_cache()

    def pin_memory(self, tensor: torch.Tensor) -> torch.Tensor:
        """Return ``tensor`` page-locked, or itself where the device cannot pin."""
        return super().pin_memory(tensor) if self.supports_pinned_memory else tensor

    def empty_pinned(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """Return a new host tensor, page-locked where the device can pin."""
        if self.supports_pinned_memory:
            return super().empty_pinned(shape, dtype)
        return torch.empty(tuple(shape), dtype=dtype)


def _not_registered() -> str:
    if not _compat.DEVICE_BACKENDS_AUTOLOAD:
        return (
            f"no device has joined torch through PrivateUse1 yet, and torch "
            f"{torch.__version__} does not load device extensions by itself (autoloading "
            "arrived in torch 2.5): import the vendor's torch package before accel looks "
            "for backends (before the first get_backend()), or call accel.reset_backends() "
            "after importing it."
        )
    autoload = os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1")
    off = (
        f" TORCH_DEVICE_BACKEND_AUTOLOAD is {autoload!r}, so torch loaded none: unset it or "
        "import the vendor's package first."
        if autoload != "1"
        else ""
    )
    return (
        "no device has joined torch through PrivateUse1 (torch.device('privateuseone') "
        "keeps its default name): install the vendor's torch package, which torch loads at "
        f"`import torch` through its 'torch.backends' entry point.{off}"
    )


def _no_module(device_type: str) -> str:
    return (
        f"PrivateUse1 is named {device_type!r}, but no device module torch.{device_type} is "
        "registered (torch._register_device_module), so accel cannot drive the device; "
        "reinstall the vendor's torch package, or check that it finished loading."
    )


def _probe() -> Availability:
    device_type = registered_device()
    if device_type is None:
        return Availability.unavailable(_not_registered())
    module = getattr(torch, device_type, None)
    if module is None:
        return Availability.unavailable(_no_module(device_type))
    try:
        available = bool(module.is_available())
        count = int(module.device_count()) if available else 0
    except Exception as exc:
        return Availability.unavailable(
            f"torch.{device_type} could not say whether a device is present "
            f"({type(exc).__name__}: {exc}); check the vendor's driver and runtime."
        )
    if count <= 0:
        return Availability.unavailable(
            f"no {device_type} device is visible (torch.{device_type}.is_available() is "
            f"{available}, device_count() is {count}); check the vendor's driver and its "
            "visible-devices environment variable."
        )
    return Availability(available=True, device_count=count)


@hookimpl
def accel_backends() -> Sequence[BackendSpec]:
    """Provide the backend for the PrivateUse1 device, named after it."""
    device_type = registered_device()
    if device_type is None:
        return [
            BackendSpec(
                name=UNREGISTERED_NAME,
                factory=PrivateUse1Backend,
                probe=_probe,
                description="The device a vendor registers with torch through PrivateUse1.",
                priority=-1,
            )
        ]
    return [
        BackendSpec(
            name=device_type,
            factory=lambda: PrivateUse1Backend(device_type),
            probe=_probe,
            description=f"torch.{device_type}, registered through PrivateUse1 (generic).",
            priority=PRIORITY,
            device_type=device_type,
        )
    ]
