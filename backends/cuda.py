"""The ``cuda`` backend: NVIDIA (and ROCm) GPUs through ``torch.cuda``.

Availability and ``device_count()`` come from ``torch.cuda.device_count()``; accel never
calls ``torch.cuda.is_available()``, which runs ``cuInit`` unless
``PYTORCH_NVML_BASED_CUDA_CHECK=1``. Whether counting keeps the process forkable depends
on how torch can count:

* NVIDIA, NVML loads and works, and ``CUDA_VISIBLE_DEVICES`` holds indices (no MIG
  UUIDs): counted through NVML, no CUDA context, the process can still ``fork``;
* NVML missing or failing, or MIG UUIDs (``MIG-...``) in ``CUDA_VISIBLE_DEVICES``: torch
  falls back to ``cudaGetDeviceCount``, which initialises the driver, and a forked child
  can no longer use CUDA (DeepSpeed#6810 shows the failure);
* ROCm: counted through amdsmi.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from accel import Availability, BackendSpec, hookimpl

from ._common import visible_devices
from ._cuda_attention import cuda_attention_kernel
from ._torch_device import TorchDeviceBackend

__all__ = ["CudaBackend", "accel_backends"]


class CudaBackend(TorchDeviceBackend):
    """NVIDIA or AMD GPUs; communication over ``nccl`` (RCCL on ROCm)."""

    name = "cuda"
    device_type = "cuda"
    communication_backend = "nccl"
    # Every data-centre GPU (and consumer ones since Kepler) copies each way on its own
    # engine; a constant, so that reading it initialises nothing.
    copy_engines = 2

    def __init__(self) -> None:
        super().__init__(torch.cuda)

    def attention_kernel(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        enable_gqa: bool = False,
    ) -> str | None:
        """The attention kernel the GPU runs for this call (:class:`accel.AttentionKernel`).

        ``None`` where the tensors are on a visible GPU (torch asks the GPU itself, fake
        tensors included); elsewhere torch's rules for an NVIDIA data-centre GPU at this
        torch release (:mod:`backends._cuda_attention`). Initialises nothing.
        """
        return cuda_attention_kernel(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)


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
