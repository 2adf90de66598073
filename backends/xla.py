"""The ``xla`` backend: Google TPUs and AWS Trainium/Inferentia through PyTorch/XLA.

PyTorch/XLA (``torch_xla``) is a lazy-tensor runtime: operations on ``xla`` tensors
are traced into a graph that is compiled and run when :meth:`XlaBackend.mark_step`
(``torch_xla.sync()``) is called, or when a value is read on the host. The same
package drives Google TPUs, AWS Neuron devices (torch-neuronx builds on it) and a CPU
client (``PJRT_DEVICE=CPU``) that runs anywhere, which CI uses.

When accel imports it: ``import torch_xla`` changes torch (it replaces
``torch.nn.utils.clip_grad_norm_`` and ``torch.nn.GRU``, sets dynamo options, writes
``XLA_FLAGS`` and ``TF_CPP_MIN_LOG_LEVEL``, registers the ``xla`` process-group
backend), so auto-detection and ``python -m accel`` never import it: they read device
nodes and sysfs (:mod:`backends._xla_host`). Naming the backend (``get_backend("xla")``,
``ACCEL=xla``) imports it, and the client torch_xla picks runs: ``PJRT_DEVICE`` when
set, else a TPU or Neuron device when present, else its CPU client.

What differs from an eager device:

* RNG: XLA keeps one seed per device, a Python int (not a generator state tensor,
  and not seeded by ``torch.manual_seed``). accel carries it as 8 little-endian bytes
  in a ``uint8`` tensor, so it round-trips through the protocol like any state.
* Recomputation: :meth:`XlaBackend.recompute_barrier` is XLA's optimisation barrier,
  so the compiler cannot merge a checkpoint's recomputation back into the forward
  (pytorch/xla#3455); a ``mark_step`` there would cut the step into several graphs.
* No user-visible streams, no pinned memory (host to device copies are synchronous
  copies whatever the source), and memory statistics only where the PJRT client has
  an allocator to ask (TPU, Neuron; not the CPU client).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Sequence
from contextlib import AbstractContextManager
from types import ModuleType
from typing import Any

import torch

from accel import Availability, BackendSpec, hookimpl

from . import _xla_host
from ._common import autocast_kwargs_for, checked_index, forked_rng
from ._null import WithoutStreams

__all__ = ["XlaBackend", "accel_backends"]

VENDOR_PACKAGE = "torch_xla"
_SEED_BYTES = 8
_SEED_MASK = (1 << 64) - 1


def seed_to_state(seed: int) -> torch.Tensor:
    """Return XLA's integer seed as the protocol's ``uint8`` state (8 bytes, little-endian)."""
    data = (int(seed) & _SEED_MASK).to_bytes(_SEED_BYTES, "little")
    return torch.tensor(list(data), dtype=torch.uint8)


def state_to_seed(state: torch.Tensor) -> int:
    """Return the integer seed held by a state from :func:`seed_to_state`.

    Raises:
        ValueError: ``state`` is not 8 ``uint8`` values.
    """
    if (
        not isinstance(state, torch.Tensor)
        or state.dtype != torch.uint8
        or state.numel() != _SEED_BYTES
    ):
        described = (
            f"a {state.dtype} tensor of {state.numel()} elements"
            if isinstance(state, torch.Tensor)
            else type(state).__name__
        )
        raise ValueError(
            f"xla: an RNG state must be the 8-element uint8 tensor get_rng_state() returns "
            f"(XLA's seed as little-endian bytes), got {described}; pass a state read from "
            "this backend."
        )
    return int.from_bytes(bytes(state.cpu().tolist()), "little")


class XlaBackend(WithoutStreams):
    """PyTorch/XLA devices: lazy, with device memory of their own; ``xla`` for communication.

    Creating it imports ``torch_xla`` (see the module docstring for what that changes)
    and starts its runtime (the PJRT client).
    ``device_count()`` counts the devices this process addresses (with the CPU client,
    ``CPU_NUM_DEVICES``, default 1).
    """

    name = "xla"
    device_type = "xla"
    is_lazy = True
    is_asynchronous = True
    supports_pinned_memory = False
    compile_backend = "openxla"
    communication_backend = "xla"

    def __init__(self) -> None:
        self._torch_xla = importlib.import_module("torch_xla")
        self._xm = importlib.import_module("torch_xla.core.xla_model")
        self._runtime = importlib.import_module("torch_xla.runtime")
        self._hardware = str(self._runtime.device_type() or "CPU").upper()
        # Start the runtime now: autograd sizes its per-device queues from the devices
        # torch knows when its engine first runs, and XLA reports its devices only once
        # the runtime is up. A backward before that, then one on xla tensors, fails in
        # torch ("device_ready_queues_ ... INTERNAL ASSERT FAILED", torch 2.9.1).
        self._runtime.addressable_runtime_device_count()

    # Identity ---------------------------------------------------------------------------

    @property
    def hardware(self) -> str:
        """The PJRT client's device kind: ``"CPU"``, ``"TPU"``, ``"NEURON"``..."""
        return self._hardware

    def device(self, index: int | None = None) -> torch.device:
        """Return ``torch.device("xla", index)`` (default: the current device)."""
        if index is None:
            return torch.device("xla", self.current_device())
        return torch.device("xla", checked_index(self.name, index, self.device_count()))

    def device_count(self) -> int:
        """Return how many XLA devices this process addresses (the runtime is up already)."""
        return int(self._runtime.addressable_runtime_device_count())

    def current_device(self) -> int:
        """Return the index of the device torch_xla places new ``xla`` tensors on."""
        default = str(self._torch_xla._XLAC._xla_get_default_device())
        _, _, index = default.partition(":")
        return int(index) if index.isdigit() else 0

    def set_device(self, index: int) -> None:
        """Make ``xla:index`` the device new ``xla`` tensors go to."""
        checked_index(self.name, index, self.device_count())
        self._torch_xla.device(index)

    def is_available(self) -> bool:
        """Return ``True``: torch_xla imported, so some PJRT client (at least CPU) runs."""
        return True

    # Ordering ---------------------------------------------------------------------------

    def synchronize(self) -> None:
        """Wait until every graph already sent to the devices has finished.

        Pending (not yet flushed) operations are not sent: call :meth:`mark_step` first.
        """
        self._xm.wait_device_ops()

    def mark_step(self) -> None:
        """Compile (or reuse) and launch the graph of every pending ``xla`` tensor.

        ``torch_xla.sync()``; it does not wait for the device. It also advances XLA's
        seed, as every XLA step does.
        """
        self._torch_xla.sync()

    def recompute_barrier(self, tensors: Sequence[torch.Tensor]) -> None:
        """Put the floating-point ``xla`` tensors among ``tensors`` behind one XLA barrier.

        In place (``xm.optimization_barrier_``) and invisible to autograd; values are
        unchanged. Work computed from them afterwards cannot be merged with the forward
        or scheduled before the other tensors of the barrier exist. Integer tensors
        (indices, masks) stay out: with torch_xla 2.9.0 an index tensor behind a barrier
        that feeds ``index_select`` aborts the process (XLA ``shape.h:848 Check failed:
        buffer != nullptr``), and what is recomputed from indices alone is not worth
        fencing.
        """
        on_device = [
            t
            for t in tensors
            if isinstance(t, torch.Tensor) and t.device.type == "xla" and t.is_floating_point()
        ]
        if on_device:
            self._xm.optimization_barrier_(on_device)

    # Capabilities -----------------------------------------------------------------------

    @property
    def supports_memory_stats(self) -> bool:
        """Whether the PJRT client reports allocator statistics (TPU, Neuron; not CPU)."""
        return self._hardware != "CPU"

    # RNG --------------------------------------------------------------------------------

    def _device_name(self, index: int | None) -> str:
        if index is None:
            return f"xla:{self.current_device()}"
        return f"xla:{checked_index(self.name, index, self.device_count())}"

    def manual_seed(self, seed: int) -> None:
        """Set the current device's XLA seed (``torch.manual_seed`` does not reach XLA)."""
        self._xm.set_rng_state(int(seed) & _SEED_MASK, self._device_name(None))

    def get_rng_state(self, index: int | None = None) -> torch.Tensor:
        """Return device ``index``'s XLA seed as an 8-byte ``uint8`` tensor (runs no graph)."""
        return seed_to_state(self._xm.get_rng_state(self._device_name(index)))

    def set_rng_state(self, state: torch.Tensor, index: int | None = None) -> None:
        """Set device ``index``'s XLA seed from a state :meth:`get_rng_state` returned."""
        self._xm.set_rng_state(state_to_seed(state), self._device_name(index))

    def fork_rng(
        self, enabled: bool = True, devices: Sequence[int] | None = None
    ) -> AbstractContextManager[None]:
        """Return a context that restores the CPU seed and the XLA seeds of ``devices``."""
        if devices is not None:
            for index in devices:
                checked_index(self.name, index, self.device_count())
        return forked_rng(enabled, self.get_rng_state, self.set_rng_state, devices)

    # Autocast ---------------------------------------------------------------------------

    def autocast_kwargs(self) -> dict[str, Any]:
        """Return the ``xla`` autocast state as ``torch.autocast`` keywords."""
        return autocast_kwargs_for(self.device_type)

    # Memory -----------------------------------------------------------------------------

    def _memory_info(self) -> dict[str, int]:
        if not self.supports_memory_stats:
            return {}
        info: dict[str, int] = self._xm.get_memory_info(self._device_name(None))
        return info

    def memory_allocated(self) -> int:
        """Return the bytes in use on the current device (0 where the client has no stats)."""
        return int(self._memory_info().get("bytes_used", 0))

    def max_memory_allocated(self) -> int:
        """Return the client's peak bytes in use (0 where the client has no stats).

        PJRT keeps the peak since the runtime started; it cannot be reset.
        """
        return int(self._memory_info().get("peak_bytes_used", 0))

    def reset_peak_memory_stats(self) -> None:
        """Do nothing: PJRT offers no way to reset its peak (see :meth:`max_memory_allocated`)."""

    def empty_cache(self) -> None:
        """Do nothing: PJRT frees a device buffer when its last tensor goes; no cache is kept."""

    def pin_memory(self, tensor: torch.Tensor) -> torch.Tensor:
        """Return ``tensor``: XLA copies from any host memory the same way (no pinning)."""
        return tensor

    def empty_pinned(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """Return ``torch.empty(shape, dtype=dtype)`` on the host (XLA pins nothing)."""
        return torch.empty(tuple(shape), dtype=dtype)

    # Dtypes and distributed -------------------------------------------------------------

    def is_bf16_supported(self) -> bool:
        """Return ``True``: every XLA client computes in bfloat16."""
        return True

    def is_fp16_supported(self) -> bool:
        """Return ``True``: XLA computes float16 (TPUs emulate it, more slowly than bf16)."""
        return True

    def prepare_distributed(self) -> None:
        """Import ``torch_xla.distributed.xla_backend``, which registers the ``xla`` backend."""
        importlib.import_module("torch_xla.distributed.xla_backend")

    def __repr__(self) -> str:
        return f"XlaBackend(name='xla', hardware={self._hardware!r})"


def _not_installed() -> Availability | None:
    if importlib.util.find_spec(VENDOR_PACKAGE) is None:
        return Availability.unavailable(
            f"{VENDOR_PACKAGE} is not installed; install PyTorch/XLA with the torch release "
            "it was built for (torch_xla 2.9.0 pairs with torch 2.9.1)."
        )
    return None


def _probe() -> Availability:
    """Listing and auto-detection: read the host, never import torch_xla.

    Available wherever torch_xla is installed (its CPU client runs anywhere), but picked
    by auto-detection only where a TPU or Neuron device is present and ``PJRT_DEVICE``
    does not name another client.
    """
    missing = _not_installed()
    if missing is not None:
        return missing
    selected = os.environ.get("PJRT_DEVICE", "").strip().upper()
    if selected and selected not in _xla_host.ACCELERATOR_CLIENTS:
        return Availability.by_name_only(
            f"PJRT_DEVICE={selected} selects XLA's {selected} client, which auto-detection "
            "never picks; select it by name (ACCEL=xla or get_backend('xla'))."
        )
    found = _xla_host.scan(_xla_host.FILESYSTEM_ROOT)
    if not found.devices:
        return Availability.by_name_only(
            f"{VENDOR_PACKAGE} is installed but no TPU or Neuron device is present "
            f"({found.describe()}), so auto-detection keeps cpu; ACCEL=xla selects XLA's "
            "CPU client."
        )
    return Availability(available=True, device_count=len(found.devices))


def _named_probe() -> Availability:
    """``get_backend("xla")``/``ACCEL=xla``: import torch_xla and let it pick its client."""
    missing = _not_installed()
    if missing is not None:
        return missing
    try:
        runtime: ModuleType = importlib.import_module("torch_xla.runtime")
        kind = runtime.device_type()
    except Exception as exc:
        return Availability.unavailable(
            f"importing torch_xla failed with {type(exc).__name__}: {exc} (torch "
            f"{torch.__version__}). torch_xla works only with the torch release it was built "
            "for (torch_xla 2.9.0: torch 2.9.1); install the matching pair."
        )
    if kind is None:
        return Availability.unavailable(
            "torch_xla selected no PJRT client (PJRT_DEVICE unset and automatic selection "
            "off); set PJRT_DEVICE to TPU, NEURON or CPU."
        )
    return Availability(available=True, device_count=1)


@hookimpl
def accel_backends() -> Sequence[BackendSpec]:
    """Provide the ``xla`` backend."""
    return [
        BackendSpec(
            name="xla",
            factory=XlaBackend,
            probe=_probe,
            description="Google TPU / AWS Trainium via PyTorch/XLA (lazy; openxla; xla).",
            priority=250,
            named_probe=_named_probe,
        )
    ]
