"""The ``xpu`` backend: Intel GPUs through ``torch.xpu``."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from accel import Availability, BackendSpec, hookimpl

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
    if not torch.xpu._is_compiled():
        return Availability.unavailable(
            f"no XPU device is visible: this torch build ({torch.__version__}) has no XPU "
            "support; install an XPU build of torch."
        )
    count = torch.xpu.device_count()
    if count <= 0:
        return Availability.unavailable(
            "no XPU device is visible (torch.xpu.device_count() is 0); check the Intel GPU "
            "driver and ZE_AFFINITY_MASK."
        )
    return Availability(available=True, device_count=count)


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
