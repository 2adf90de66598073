"""The ``cuda`` backend: NVIDIA (and ROCm) GPUs through ``torch.cuda``.

Availability is counted through NVML, so probing never initialises CUDA and the
process stays forkable (DeepSpeed#6810 shows what happens otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from accel import Availability, BackendSpec, hookimpl

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
    if torch.version.cuda is None and torch.version.hip is None:
        return Availability.unavailable(
            f"no CUDA device is visible: this torch build ({torch.__version__}) has no CUDA "
            "support; install a CUDA build of torch."
        )
    count = torch.cuda.device_count()
    if count <= 0:
        return Availability.unavailable(
            "no CUDA device is visible (torch.cuda.device_count() is 0); check the NVIDIA "
            "driver with nvidia-smi and the CUDA_VISIBLE_DEVICES variable."
        )
    return Availability(available=True, device_count=count)


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
