"""Every ``DeepSpeedAccelerator`` member, answered from the accel protocol.

:class:`ProtocolAnswers` is a mixin: :func:`accelerator_class` puts it before DeepSpeed's
abstract base, so each abstract method DeepSpeed declares is answered here. Where the
protocol has no counterpart, the answer is DeepSpeed's own neutral one, the one its CPU
accelerator gives (graphs, profiler ranges, op builders), delegated to a
``CPU_Accelerator``; each such member says so.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch

from ..._protocol import Accelerator

__all__ = ["ProtocolAnswers"]

# DeepSpeed's CPU op builders that replace torch.distributed collectives on host tensors.
_COLLECTIVE_BUILDERS = frozenset({"CCLCommBuilder", "ShareMemCommBuilder"})


class _DeviceGenerator:
    """The generator of one device, read and written through the backend's RNG members.

    DeepSpeed's activation checkpointing calls ``default_generator(i).set_state(s)``; the
    protocol keeps device generators behind ``get_rng_state``/``set_rng_state``.
    """

    def __init__(self, backend: Accelerator, index: int) -> None:
        self._backend = backend
        self._index = index

    def get_state(self) -> torch.Tensor:
        """Return a copy of this device's generator state."""
        return self._backend.get_rng_state(self._index)

    def set_state(self, state: torch.Tensor) -> None:
        """Restore a state returned by :meth:`get_state`."""
        self._backend.set_rng_state(state, self._index)


class ProtocolAnswers:
    """DeepSpeed's accelerator interface on top of an accel backend."""

    # Set by accelerator(): the backend, and DeepSpeed's CPU accelerator for neutral answers.
    backend: Accelerator
    _neutral: Any
    _name: str
    _communication_backend_name: str
    _compile_backend: str

    def _index(self, device_index: Any = None) -> int:
        """Map DeepSpeed's index to the backend's: one device per process maps to 0."""
        if device_index is None or device_index == -1:
            return self.backend.current_device()
        if isinstance(device_index, torch.device):
            device_index = device_index.index or 0
        if self.backend.device_count() <= 1:
            return 0  # the host, or a card per process: every local rank uses index 0
        return int(device_index)

    # Semantics: DeepSpeed asks whether device work is ordered with the host. ----------

    def is_synchronized_device(self) -> bool:
        """Return whether device work finishes before the host goes on (not asynchronous)."""
        return not self.backend.is_asynchronous

    def use_host_timers(self) -> bool:
        """Return :meth:`is_synchronized_device`: host timers measure synchronous devices."""
        return self.is_synchronized_device()

    def resolves_data_dependency(self) -> bool:
        """Return whether the runtime orders dependent work itself (synchronous or lazy)."""
        return self.is_synchronized_device() or self.backend.is_lazy

    def handles_memory_backpressure(self) -> bool:
        """Return whether the runtime throttles allocations itself (synchronous or lazy)."""
        return self.is_synchronized_device() or self.backend.is_lazy

    # Device ------------------------------------------------------------------------------

    def device_name(self, device_index: Any = None) -> str:
        """Return the device type, or ``"type:index"`` for an index (``"cpu"`` on the host)."""
        if device_index is None:
            return self.backend.device_type
        return str(self.backend.device(self._index(device_index)))

    def device(self, device_index: Any = None) -> torch.device:
        """Return ``backend.device(index)``."""
        return self.backend.device(self._index(device_index))

    def set_device(self, device_index: Any) -> None:
        """Make ``device_index`` current (``backend.set_device``)."""
        self.backend.set_device(self._index(device_index))

    def current_device(self) -> int:
        """Return ``backend.current_device()``."""
        return self.backend.current_device()

    def current_device_name(self) -> str:
        """Return the current device as ``"type:index"`` (``"cpu"`` on the host)."""
        return str(self.backend.device())

    def device_count(self) -> int:
        """Return ``backend.device_count()``."""
        return self.backend.device_count()

    def synchronize(self, device_index: Any = None) -> None:
        """Wait for the device (``backend.synchronize()``)."""
        self.backend.synchronize()

    # RNG ----------------------------------------------------------------------------------

    def random(self) -> Any:
        """Return ``torch.random``, as every DeepSpeed accelerator does."""
        return torch.random

    def set_rng_state(self, new_state: torch.Tensor, device_index: Any = None) -> None:
        """Restore a device generator state (``backend.set_rng_state``)."""
        self.backend.set_rng_state(new_state, self._index(device_index))

    def get_rng_state(self, device_index: Any = None) -> torch.Tensor:
        """Return a device generator state (``backend.get_rng_state``)."""
        return self.backend.get_rng_state(self._index(device_index))

    def manual_seed(self, seed: int) -> None:
        """Seed the current device's generator (``backend.manual_seed``)."""
        self.backend.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        """Seed every device of this process, leaving the current device as it was."""
        current = self.backend.current_device()
        for index in range(max(1, self.backend.device_count())):
            self.backend.set_device(index)
            self.backend.manual_seed(seed)
        self.backend.set_device(current)

    def initial_seed(self) -> int:
        """Return ``torch.initial_seed()`` (the protocol keeps no device seed; CPU's answer)."""
        return torch.initial_seed()

    def default_generator(self, device_index: Any) -> _DeviceGenerator:
        """Return an object whose ``get_state``/``set_state`` go to that device's generator."""
        return _DeviceGenerator(self.backend, self._index(device_index))

    # Streams and events ------------------------------------------------------------------

    @property
    def Stream(self) -> Callable[..., Any]:
        """Return the backend's stream class (null streams where it has none)."""
        return self.backend.Stream

    def stream(self, stream: Any) -> AbstractContextManager[Any]:
        """Return a context queueing work on ``stream``; ``None`` queues on the current one."""
        return self.backend.stream(self.backend.current_stream() if stream is None else stream)

    def current_stream(self, device_index: Any = None) -> Any:
        """Return ``backend.current_stream()``."""
        return self.backend.current_stream()

    def default_stream(self, device_index: Any = None) -> Any:
        """Return the current stream: the protocol has no separate default stream.

        Right wherever work is queued on the default stream, which is where DeepSpeed
        asks for it (to wait for it from its side streams).
        """
        return self.backend.current_stream()

    @property
    def Event(self) -> Callable[..., Any]:
        """Return the backend's event class (events complete at once where it has no streams)."""
        return self.backend.Event

    # Memory: the protocol's figures where the backend keeps them, CPU's answer otherwise --

    def empty_cache(self) -> None:
        """Return cached memory to the system (``backend.empty_cache()``)."""
        self.backend.empty_cache()

    def _figure(self, member: str, device_index: Any) -> Any:
        """Answer a memory figure the protocol does not have: the CPU accelerator's."""
        return getattr(self._neutral, member)(device_index)

    def memory_allocated(self, device_index: Any = None) -> int:
        """Return ``backend.memory_allocated()``; the process RSS without statistics (CPU's)."""
        if self.backend.supports_memory_stats:
            return self.backend.memory_allocated()
        return int(self._figure("memory_allocated", device_index))

    def max_memory_allocated(self, device_index: Any = None) -> int:
        """Return ``backend.max_memory_allocated()``; the peak RSS without statistics."""
        if self.backend.supports_memory_stats:
            return self.backend.max_memory_allocated()
        return int(self._figure("max_memory_allocated", device_index))

    def reset_max_memory_allocated(self, device_index: Any = None) -> None:
        """Start a new peak (``backend.reset_peak_memory_stats()``)."""
        self.reset_peak_memory_stats(device_index)

    def reset_peak_memory_stats(self, device_index: Any = None) -> None:
        """Start a new peak (``backend.reset_peak_memory_stats()``; CPU's RSS peak too)."""
        self.backend.reset_peak_memory_stats()
        self._neutral.reset_peak_memory_stats(device_index)

    def memory_reserved(self, device_index: Any = None) -> int:
        """Return the allocated figure: the protocol counts no cache separately.

        A lower bound of what the allocator holds where it caches; on the host, the
        CPU accelerator's RSS.
        """
        return self.memory_allocated(device_index)

    def max_memory_reserved(self, device_index: Any = None) -> int:
        """Return :meth:`max_memory_allocated` (see :meth:`memory_reserved`)."""
        return self.max_memory_allocated(device_index)

    memory_cached = memory_reserved
    max_memory_cached = max_memory_reserved

    def reset_max_memory_cached(self, device_index: Any = None) -> None:
        """Start a new peak (as :meth:`reset_peak_memory_stats`)."""
        self.reset_peak_memory_stats(device_index)

    def memory_stats(self, device_index: Any = None) -> dict[str, int]:
        """Return the current and peak allocated bytes under torch's key names."""
        return {
            "allocated_bytes.all.current": self.memory_allocated(device_index),
            "allocated_bytes.all.peak": self.max_memory_allocated(device_index),
        }

    def total_memory(self, device_index: Any = None) -> int:
        """Return the host's memory (CPU's answer): the protocol has no device capacity."""
        return int(self._figure("total_memory", device_index))

    def available_memory(self, device_index: Any = None) -> int:
        """Return the host's free memory (CPU's answer), as :meth:`total_memory`."""
        return int(self._figure("available_memory", device_index))

    # Dtypes ---------------------------------------------------------------------------

    def is_bf16_supported(self) -> bool:
        """Return ``backend.is_bf16_supported()``."""
        return self.backend.is_bf16_supported()

    def is_fp16_supported(self) -> bool:
        """Return ``backend.is_fp16_supported()``."""
        return self.backend.is_fp16_supported()

    def supported_dtypes(self) -> list[torch.dtype]:
        """Return float32, then bfloat16 and float16 where the backend computes in them."""
        dtypes = [torch.float32]
        if self.is_bf16_supported():
            dtypes.append(torch.bfloat16)
        if self.is_fp16_supported():
            dtypes.append(torch.float16)
        return dtypes

    # Misc -----------------------------------------------------------------------------

    def is_available(self) -> bool:
        """Return ``backend.is_available()``."""
        return self.backend.is_available()

    def range_push(self, msg: str, domain: Any = None, category: Any = None) -> None:
        """Do nothing (CPU's answer): the protocol has no profiler ranges."""

    def range_pop(self, domain: Any = None) -> None:
        """Do nothing (CPU's answer), as :meth:`range_push`."""

    def lazy_call(self, callback: Callable[[], Any]) -> Any:
        """Call ``callback`` now: accel backends need no deferred device initialisation."""
        return callback()

    def communication_backend_name(self) -> str:
        """Return ``backend.communication_backend`` (``gloo``, ``nccl``, ``hccl``...)."""
        return self.backend.communication_backend

    def is_triton_supported(self) -> bool:
        """Return ``False`` (CPU's answer): the protocol says nothing of Triton kernels."""
        return False

    # Graphs: no graph capture in the protocol; CPU's no-op answers -----------------------

    def create_graph(self) -> Any:
        """Return ``None`` (CPU's answer): no graph capture."""
        return None

    def capture_to_graph(self, graph: Any, pool: Any = None, stream: Any = None) -> Any:
        """Return CPU's no-op context: no graph capture."""
        return self._neutral.capture_to_graph(graph, pool, stream)

    def replay_graph(self, graph: Any) -> None:
        """Do nothing (CPU's answer): no graph was captured."""

    # Placement and pinning ------------------------------------------------------------

    def on_accelerator(self, tensor: torch.Tensor) -> bool:
        """Return whether ``tensor`` is on the backend's device type."""
        return tensor.device.type == self.backend.device_type

    def _torch_pin_memory(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.backend.pin_memory(tensor)

    def _torch_empty_pinned(self, tensor: torch.Tensor, shape: Any) -> torch.Tensor:
        return self.backend.empty_pinned(tuple(shape), tensor.dtype)

    def _torch_is_pinned(self, tensor: torch.Tensor) -> bool:
        return bool(self.backend.supports_pinned_memory and tensor.is_pinned())

    # Op builders and launcher: CPU's answers ------------------------------------------

    def op_builder_dir(self) -> str:
        """Return CPU's op builders: host kernels (device kernels are the vendor's own)."""
        return str(self._neutral.op_builder_dir())

    def create_op_builder(self, class_name: str) -> Any:
        """Return CPU's op builder instance for ``class_name``; ``None`` for collectives.

        The CPU accelerator's shared-memory and oneCCL collectives (``ShareMemCommBuilder``,
        ``CCLCommBuilder``) would replace ``backend.communication_backend`` for host
        tensors; without them DeepSpeed's collectives go through ``torch.distributed``
        on the backend's own communication library (and no C++ op is compiled at
        ``deepspeed.init_distributed``).
        """
        if class_name in _COLLECTIVE_BUILDERS:
            return None
        return self._neutral.create_op_builder(class_name)

    def get_op_builder(self, class_name: str) -> Any:
        """Return CPU's op builder class for ``class_name``; ``None`` for collectives."""
        if class_name in _COLLECTIVE_BUILDERS:
            return None
        return self._neutral.get_op_builder(class_name)

    def build_extension(self) -> Any:
        """Return torch's ``BuildExtension`` (CPU's answer)."""
        return self._neutral.build_extension()

    def export_envs(self) -> list[str]:
        """Return ``[]`` (CPU's answer): no variables for the launcher to export."""
        return []

    def visible_devices_envs(self) -> list[str]:
        """Return ``[]``: accel names no per-vendor visibility variable.

        DeepSpeed's launcher then leaves device visibility alone, and each process
        binds its device by local rank (as :func:`accel.distributed.init_process_group`
        does); CPU's answer, ``CUDA_VISIBLE_DEVICES``, would be wrong for most backends.
        """
        return []

    def set_visible_devices_envs(
        self, current_env: dict[str, str], local_accelerator_ids: Any
    ) -> None:
        """Do nothing: there is no visibility variable (see :meth:`visible_devices_envs`)."""

    # Compilation ----------------------------------------------------------------------

    def get_compile_backend(self) -> str:
        """Return the ``torch.compile`` backend: ``backend.compile_backend`` until set."""
        return self._compile_backend

    def set_compile_backend(self, backend: str) -> None:
        """Use ``backend`` for ``torch.compile``; it must be one torch knows.

        Raises:
            ValueError: ``backend`` is not in ``torch._dynamo.list_backends``.
        """
        import torch._dynamo

        known = torch._dynamo.list_backends(exclude_tags=())
        if backend not in known:
            raise ValueError(
                f"accel.integrations.deepspeed: compile backend {backend!r} is not one torch "
                f"knows ({', '.join(known)}); pass one of those."
            )
        self._compile_backend = backend


def _typed_constructor(dtype: torch.dtype) -> property:
    def constructor(self: ProtocolAnswers) -> Callable[..., torch.Tensor]:
        return functools.partial(torch.tensor, dtype=dtype, device=self.backend.device_type)

    constructor.__doc__ = f"``torch.tensor`` with ``dtype={dtype}`` on the backend's device."
    return property(constructor)


# DeepSpeed's typed tensor properties (``get_accelerator().FloatTensor(data)``).
for _name, _dtype in {
    "BFloat16Tensor": torch.bfloat16,
    "ByteTensor": torch.uint8,
    "DoubleTensor": torch.float64,
    "FloatTensor": torch.float32,
    "HalfTensor": torch.float16,
    "IntTensor": torch.int32,
    "LongTensor": torch.int64,
}.items():
    setattr(ProtocolAnswers, _name, _typed_constructor(_dtype))
