"""The ``hpu`` backend: Intel Gaudi through Habana's PyTorch bridge (``habana_frameworks``).

What importing the bridge does, and when accel lets it happen:

* **When.** Auto-detection and ``python -m accel`` never import it: the probe reads device
  nodes and sysfs only (:mod:`backends._gaudi_nodes`). Naming the backend
  (``get_backend("hpu")``, ``ACCEL=hpu``) imports it to ask the bridge's own
  ``habana_frameworks.torch.hpu.is_available()``, and creating :class:`HpuBackend` keeps
  it imported. On bridge releases whose lazy-mode default is off, the bridge also
  registers a ``torch.backends`` autoload entry point, so ``import torch`` alone imports
  it, before accel runs, unless ``PT_HPU_AUTOLOAD=0`` (or ``PT_HPU_LAZY_MODE=1``).
* **torch patches.** ``import habana_frameworks.torch`` replaces ``torch.manual_seed``,
  ``torch.seed``, ``torch.random.fork_rng`` (default device becomes hpu),
  ``Tensor.record_stream``, ``torch.save``/``torch.load``, ``Module.__setattr__`` and
  ``add_module``, and ``torch.distributed.init_process_group``/``new_group``.
* **Environment writes.** It sets ``TORCHINDUCTOR_COMPILE_THREADS=1``; its
  ``distributed.hccl`` module, imported with it, registers ``hccl`` and sets
  ``HLS_MODULE_ID`` (the card, from ``LOCAL_RANK`` and ``HABANA_VISIBLE_MODULES``, when
  ``WORLD_SIZE`` > 1 and it is not set already), ``ID`` (from ``RANK``), ``WORLD_SIZE``,
  ``RANK`` and ``LOCAL_RANK`` from Open MPI's variables (some releases always write
  ``WORLD_SIZE``), and defaults for
  ``MASTER_ADDR``/``MASTER_PORT``. So ``LOCAL_RANK`` must be set before the backend is
  created (torchrun sets it at process start); ``accel.distributed.init_process_group``
  checks that it was (:attr:`HpuBackend.local_rank_at_creation`).
* **Device acquisition.** Memory statistics, streams and ``hpu.init()`` acquire the card;
  ``hpu.init()`` also makes ``torch.utils.checkpoint``'s default device type "hpu".

accel itself adds nothing to this: it writes no environment variable and changes no
torch setting, and it cannot undo what the bridge did.

Device indices: the bridge counts every card on the node, but a process uses one card,
always index 0 (the card is chosen by ``HLS_MODULE_ID`` or ``HABANA_VISIBLE_MODULES``).
So :meth:`HpuBackend.device_count` is 1, and 0 is the only valid index.

Generator states: in the bridge's philox mode (``hpu.random.set_rng_ctx("philox")``)
``get_rng_state()`` returns the generator's own state tensor, which later
``set_rng_state`` calls overwrite; :meth:`HpuBackend.get_rng_state` returns a copy.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import torch

from accel import Availability, BackendSpec, DeviceIndexError, hookimpl

from . import _gaudi_nodes
from ._common import autocast_kwargs_for
from ._torch_device import TorchDeviceBackend

__all__ = ["HpuBackend", "accel_backends", "device_nodes"]

VENDOR_PACKAGE = "habana_frameworks"
# Where the probe looks for /dev and /sys; tests point it at a fake tree.
FILESYSTEM_ROOT = "/"
_ONE_DEVICE_HINT = (
    "Gaudi runs one device per process: select the card with HABANA_VISIBLE_MODULES, or "
    "launch one process per card with torchrun."
)


def _lazy_mode(internal: ModuleType | None) -> bool:
    """Decide lazy mode the way the installed bridge does.

    Bridges that have ``habana_frameworks.torch.utils.internal.is_lazy`` know their own
    default (it flipped from 1 to 0 between releases, optimum-habana#2032) and cache
    their first answer; older bridges had no such function and defaulted to lazy mode.
    """
    if internal is not None and hasattr(internal, "is_lazy"):
        return bool(internal.is_lazy())
    return os.environ.get("PT_HPU_LAZY_MODE", "1") != "0"


def _optional_module(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _env_local_rank() -> int | None:
    raw = os.environ.get("LOCAL_RANK")
    try:
        return None if raw is None else int(raw.strip())
    except ValueError:
        return None


class HpuBackend(TorchDeviceBackend):
    """Intel Gaudi; ``hccl`` for communication; lazy or eager as the bridge runs.

    Creating it imports ``habana_frameworks.torch``, with the side effects listed in the
    module docstring (torch patches, environment writes, ``hccl`` registration). Streams,
    events, memory statistics and pinning come from ``habana_frameworks.torch.hpu``,
    whose API matches ``torch.cuda``'s; the members below are where Gaudi differs.
    """

    name = "hpu"
    device_type = "hpu"
    communication_backend = "hccl"
    compile_backend = "hpu_backend"

    def __init__(self) -> None:
        # Read before the import: the bridge picks this process's card from it.
        self._local_rank_at_creation = _env_local_rank()
        self._core = importlib.import_module("habana_frameworks.torch.core")
        self._random = importlib.import_module("habana_frameworks.torch.hpu.random")
        self._experimental = _optional_module("habana_frameworks.torch.utils.experimental")
        self._is_lazy = _lazy_mode(_optional_module("habana_frameworks.torch.utils.internal"))
        super().__init__(importlib.import_module("habana_frameworks.torch.hpu"))

    @property
    def is_lazy(self) -> bool:  # type: ignore[override]
        """Whether the bridge runs in lazy mode (``PT_HPU_LAZY_MODE``), read once."""
        return self._is_lazy

    @property
    def local_rank_at_creation(self) -> int | None:
        """``LOCAL_RANK`` when this backend was created (``None`` if unset or not an int).

        The bridge chose this process's card (``HLS_MODULE_ID``) from it on import; if
        something imported the bridge earlier (torch's autoload), it read the value then.
        """
        return self._local_rank_at_creation

    def device(self, index: int | None = None) -> torch.device:
        """Return ``torch.device("hpu", 0)``; any index but 0 raises."""
        self._check_index(0 if index is None else index)
        return torch.device("hpu", 0)

    def device_count(self) -> int:
        """Return 1 (0 when the bridge sees no card): a process uses one card, index 0.

        The bridge's own ``device_count()`` counts every card on the node; only one of
        them is this process's.
        """
        return 1 if self.is_available() else 0

    def current_device(self) -> int:
        """Return 0: the one device of this process."""
        return 0

    def set_device(self, index: int) -> None:
        """Accept index 0 only (one device per process)."""
        self._check_index(index)

    def is_available(self) -> bool:
        """Return ``habana_frameworks.torch.hpu.is_available()``; ``False`` if it raises."""
        try:
            return bool(self._module.is_available())
        except Exception:
            return False

    def mark_step(self) -> None:
        """Flush the lazy graph with ``habana_frameworks.torch.core.mark_step()``.

        In eager mode there is no graph to flush and nothing is called.
        """
        if self._is_lazy:
            self._core.mark_step()

    def recompute_barrier(self, tensors: Sequence[torch.Tensor]) -> None:
        """Flush the lazy graph before a recomputation (lazy mode); nothing in eager mode.

        The bridge offers no optimisation-barrier operator, so in lazy mode the flush is
        the barrier: the forward runs as graphs of its own, which the graph compiler
        cannot merge with the recomputation. The flush sits at the same place in every
        step (before each checkpoint's recomputation), so after the first step the
        bridge finds each graph in its cache instead of compiling it again.
        """
        self.mark_step()

    def manual_seed(self, seed: int) -> None:
        """Seed the HPU generator."""
        self._random.manual_seed(seed)

    def get_rng_state(self, index: int | None = None) -> torch.Tensor:
        """Return a copy of the HPU generator state (device 0, the only one it accepts).

        A copy, because in philox mode the bridge returns its live state tensor.
        """
        self._check_index(0 if index is None else index)
        state: torch.Tensor = self._random.get_rng_state(0)
        return state.detach().clone()

    def set_rng_state(self, state: torch.Tensor, index: int | None = None) -> None:
        """Restore the HPU generator state on device 0 (the only valid ``index``)."""
        self._check_index(0 if index is None else index)
        self._random.set_rng_state(state, 0)

    def autocast_kwargs(self) -> dict[str, Any]:
        """Return HPU autocast keywords; no ``cache_enabled``, which Gaudi does not support."""
        return autocast_kwargs_for(self.device_type, cache_supported=False)

    def empty_cache(self) -> None:
        """Do nothing: the bridge reserves device memory per process and has no cache to free."""

    def is_bf16_supported(self) -> bool:
        """Return ``True``: every Gaudi generation computes in bfloat16."""
        return True

    def is_fp16_supported(self) -> bool:
        """Return whether this Gaudi computes in float16 (Gaudi2 and later; not Gaudi1)."""
        if self._experimental is None or not hasattr(self._experimental, "_is_fp16_supported"):
            return False
        return bool(self._experimental._is_fp16_supported())

    def prepare_distributed(self) -> None:
        """Import ``habana_frameworks.torch.distributed.hccl``, which registers ``hccl``.

        Importing the bridge already imported it (when the backend was created), so this
        normally finds it loaded; it is kept for bridges that do not.
        """
        importlib.import_module("habana_frameworks.torch.distributed.hccl")

    def _check_index(self, index: int) -> None:
        if isinstance(index, bool) or not isinstance(index, int) or index != 0:
            raise DeviceIndexError(
                f"hpu: device index {index!r} is not usable; only 0 is valid. {_ONE_DEVICE_HINT}"
            )

    def __repr__(self) -> str:
        mode = "lazy" if self._is_lazy else "eager"
        return f"HpuBackend(name='hpu', mode={mode!r})"


def device_nodes() -> list[str]:
    """Return the Gaudi device nodes present on this machine (driver ``habanalabs``)."""
    return list(_gaudi_nodes.scan(FILESYSTEM_ROOT).gaudi)


def _not_installed() -> Availability | None:
    if importlib.util.find_spec(VENDOR_PACKAGE) is None:
        return Availability.unavailable(
            f"{VENDOR_PACKAGE} is not installed; install Intel Gaudi's PyTorch bridge "
            "(habana-torch-plugin) on a Gaudi machine."
        )
    return None


def _probe() -> Availability:
    """Auto-detection: the bridge is installed and a habanalabs device node exists."""
    missing = _not_installed()
    if missing is not None:
        return missing
    found = _gaudi_nodes.scan(FILESYSTEM_ROOT)
    if not found.gaudi:
        others = f" (found {', '.join(found.others)})" if found.others else ""
        return Availability.unavailable(
            f"{VENDOR_PACKAGE} is installed but no device node of the habanalabs driver "
            f"exists{others}; check the driver with hl-smi and that the container was "
            "given the devices. `get_backend('hpu')` asks the bridge itself."
        )
    return Availability(available=True, device_count=1)


def _named_probe() -> Availability:
    """``get_backend("hpu")``/``ACCEL=hpu``: import the bridge and ask it."""
    missing = _not_installed()
    if missing is not None:
        return missing
    try:
        hpu = importlib.import_module("habana_frameworks.torch.hpu")
    except Exception as exc:
        return Availability.unavailable(
            f"importing habana_frameworks.torch failed with {type(exc).__name__}: {exc} "
            f"(torch {torch.__version__}). The bridge works only with the torch release it "
            "was built for; reinstall the matching habana-torch-plugin or torch."
        )
    try:
        available = bool(hpu.is_available())
    except Exception as exc:
        return Availability.unavailable(
            f"habana_frameworks.torch.hpu.is_available() raised {type(exc).__name__}: {exc}."
        )
    if not available:
        return Availability.unavailable(
            "habana_frameworks.torch.hpu.is_available() is false: the bridge sees no Gaudi "
            "card; check the driver with hl-smi and HABANA_VISIBLE_MODULES."
        )
    return Availability(available=True, device_count=1)


@hookimpl
def accel_backends() -> Sequence[BackendSpec]:
    """Provide the ``hpu`` backend."""
    return [
        BackendSpec(
            name="hpu",
            factory=HpuBackend,
            probe=_probe,
            description="Intel Gaudi via habana_frameworks (hccl; lazy or eager mode).",
            priority=300,
            named_probe=_named_probe,
            binds_device_at_creation=True,
        )
    ]
