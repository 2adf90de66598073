"""The ``xpu`` backend: Intel GPUs through ``torch.xpu``.

Availability and ``device_count()`` come from ``torch.xpu.device_count()``. It counts
through Level Zero Sysman, without initialising a device, only when the ``pyzes``
package is installed; otherwise it initialises the SYCL runtime, and a forked child can
no longer use the XPU. Install ``pyzes`` where processes fork after probing (data
loader workers, multiprocessing launchers).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from accel import Availability, BackendSpec, hookimpl

from ._common import visible_devices
from ._torch_device import TorchDeviceBackend

__all__ = ["XpuBackend", "accel_backends"]


class XpuBackend(TorchDeviceBackend):
    """Intel GPUs; communication over ``xccl``."""

    name = "xpu"
    device_type = "xpu"
    communication_backend = "xccl"

    def __init__(self) -> None:
        super().__init__(torch.xpu)


def _probe() -> Availability:
    return visible_devices(
        "XPU",
        compiled=torch.xpu._is_compiled(),
        count=torch.xpu.device_count,
        count_call="torch.xpu.device_count()",
        hint="check the Intel GPU driver and ZE_AFFINITY_MASK.",
    )


@hookimpl
def accel_backends() -> Sequence[BackendSpec]:
    """Provide the ``xpu`` backend."""
    return [
        BackendSpec(
            name="xpu",
            factory=XpuBackend,
            probe=_probe,
            description="Intel GPUs via torch.xpu (xccl).",
            priority=150,
        )
    ]
