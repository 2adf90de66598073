"""The ``cuda`` backend: NVIDIA (and ROCm) GPUs through ``torch.cuda``.

Availability is counted through NVML, so probing never initialises CUDA and the
process stays forkable (DeepSpeed#6810 shows what happens otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from accel import Availability, BackendSpec, hookimpl

from ._common import visible_devices
from ._torch_device import TorchDeviceBackend

__all__ = ["CudaBackend", "accel_backends"]


class CudaBackend(TorchDeviceBackend):
    """NVIDIA or AMD GPUs; communication over ``nccl`` (RCCL on ROCm)."""

    name = "cuda"
    device_type = "cuda"
    communication_backend = "nccl"

    def __init__(self) -> None:
        super().__init__(torch.cuda)


def _probe() -> Availability:
    return visible_devices(
        "CUDA",
        compiled=torch.version.cuda is not None or torch.version.hip is not None,
        count=torch.cuda.device_count,
        count_call="torch.cuda.device_count()",
        hint="check the NVIDIA driver with nvidia-smi and the CUDA_VISIBLE_DEVICES variable.",
    )


@hookimpl
def accel_backends() -> Sequence[BackendSpec]:
    """Provide the ``cuda`` backend."""
    return [
        BackendSpec(
            name="cuda",
            factory=CudaBackend,
            probe=_probe,
            description="NVIDIA/AMD GPUs via torch.cuda (nccl).",
            priority=200,
        )
    ]
