"""The ``hpu`` backend: Intel Gaudi through Habana's PyTorch bridge (``habana_frameworks``).

Importing ``habana_frameworks.torch`` patches torch (``torch.manual_seed``,
``Module.__setattr__``, ``init_process_group``...), so this module imports it only in
:class:`HpuBackend`'s constructor, i.e. when ``hpu`` is selected. The availability probe
imports nothing: it checks that the package is installed and that a Gaudi device node
exists.

Gaudi runs one device per process: device index 0 only (choose the card with
``HABANA_VISIBLE_MODULES`` or launch one process per card). The backend changes no
process-wide setting: no ``torch.use_deterministic_algorithms``, no environment writes.
"""

from __future__ import annotations

import glob
import importlib
import importlib.util
import os
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import torch

from accel import Availability, BackendSpec, DeviceIndexError, hookimpl

from ._common import autocast_kwargs_for
from ._torch_device import TorchDeviceBackend

__all__ = ["HpuBackend", "accel_backends"]

VENDOR_PACKAGE = "habana_frameworks"
# The habanalabs driver exposes /dev/accel/accelN (kernel accel subsystem) and, in
# older releases, /dev/hlN.
DEVICE_NODE_GLOBS = ("/dev/accel/accel[0-9]*", "/dev/hl[0-9]*")
_ONE_DEVICE_HINT = (
    "Gaudi runs one device per process: select the card with HABANA_VISIBLE_MODULES, or "
    "launch one process per card with torchrun."
)


def _lazy_mode(internal: ModuleType | None) -> bool:
    """Decide lazy mode the way the installed bridge does.

    Bridges that have ``habana_frameworks.torch.utils.internal.is_lazy`` know their own
    default (it flipped from 1 to 0 between releases, optimum-habana#2032); older
    bridges had no such function and defaulted to lazy mode.
    """
    if internal is not None and hasattr(internal, "is_lazy"):
        return bool(internal.is_lazy())
    return os.environ.get("PT_HPU_LAZY_MODE", "1") != "0"


def _optional_module(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


class HpuBackend(TorchDeviceBackend):
    """Intel Gaudi; ``hccl`` for communication; lazy or eager as the bridge runs.

    Streams, events, memory statistics and pinning come from
    ``habana_frameworks.torch.hpu``, whose API matches ``torch.cuda``'s; the members
    below are where Gaudi differs.
    """

    name = "hpu"
    device_type = "hpu"
    communication_backend = "hccl"
    compile_backend = "hpu_backend"

    def __init__(self) -> None:
        self._core = importlib.import_module("habana_frameworks.torch.core")
        self._random = importlib.import_module("habana_frameworks.torch.hpu.random")
        self._experimental = _optional_module("habana_frameworks.torch.utils.experimental")
        self._is_lazy = _lazy_mode(_optional_module("habana_frameworks.torch.utils.internal"))
        super().__init__(importlib.import_module("habana_frameworks.torch.hpu"))

    @property
    def is_lazy(self) -> bool:  # type: ignore[override]
        """Whether the bridge runs in lazy mode (``PT_HPU_LAZY_MODE``), read once."""
        return self._is_lazy

    def device(self, index: int | None = None) -> torch.device:
        """Return ``torch.device("hpu", 0)``; any index but 0 raises."""
        self._check_index(0 if index is None else index)
        return torch.device("hpu", 0)

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

    def manual_seed(self, seed: int) -> None:
        """Seed the HPU generator."""
        self._random.manual_seed(seed)

    def get_rng_state(self, index: int | None = None) -> torch.Tensor:
        """Return the HPU generator state (device 0, the only one the bridge accepts)."""
        self._check_index(0 if index is None else index)
        state: torch.Tensor = self._random.get_rng_state(0)
        return state

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
        """Import ``habana_frameworks.torch.distributed.hccl``, which registers ``hccl``."""
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
    """Return the Gaudi device nodes present on this machine."""
    return sorted({path for pattern in DEVICE_NODE_GLOBS for path in glob.glob(pattern)})


def _probe() -> Availability:
    if importlib.util.find_spec(VENDOR_PACKAGE) is None:
        return Availability.unavailable(
            f"{VENDOR_PACKAGE} is not installed; install Intel Gaudi's PyTorch bridge "
            "(habana-torch-plugin) on a Gaudi machine."
        )
    nodes = device_nodes()
    if not nodes:
        return Availability.unavailable(
            f"{VENDOR_PACKAGE} is installed but no Gaudi device node "
            f"({' or '.join(DEVICE_NODE_GLOBS)}) exists; check the habanalabs driver with "
            "hl-smi, and that the container was given the devices."
        )
    return Availability(available=True, device_count=len(nodes))


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
        )
    ]
