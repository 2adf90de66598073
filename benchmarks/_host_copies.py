"""Host memory and host copies per training step, for ``bench_offload.py --host-copies``.

Pinning an existing tensor (``backend.pin_memory``) allocates page-locked memory and
copies the tensor into it: the pageable block was allocated only to be copied.
``backend.empty_pinned`` allocates page-locked memory directly. This module counts, per
step of each offload path, the host bytes allocated for transfers and the host-to-host
copies made by pinning, with every device copy forced on (the path an accelerator takes)
through a CPU backend that pins the way a device backend does: ``pin_memory`` copies,
``empty_pinned`` allocates.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from backends.cpu import CpuBackend
from checkpointing._offload import copy_to_host, restore
from offload import OffloadModel, offload_parameters
from offload._core import transfer as offload_transfer


class PinCountingBackend(CpuBackend):
    """A CPU backend that reports pinned memory, and counts what pinning costs."""

    name = "cpu"
    supports_pinned_memory = True  # type: ignore[assignment]

    def __init__(self) -> None:
        self.copies = 0
        self.copied_bytes = 0
        self.allocated_bytes = 0

    def reset(self) -> None:
        self.copies = self.copied_bytes = self.allocated_bytes = 0

    def pin_memory(self, tensor: torch.Tensor) -> torch.Tensor:
        nbytes = tensor.numel() * tensor.element_size()
        self.copies += 1
        self.copied_bytes += nbytes
        self.allocated_bytes += 2 * nbytes  # the pageable source and the pinned copy
        return tensor.clone()

    def empty_pinned(self, shape: Any, dtype: torch.dtype) -> torch.Tensor:
        block = torch.empty(tuple(shape), dtype=dtype)
        self.allocated_bytes += block.numel() * block.element_size()
        return block


def _model(blocks: int, width: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        *[nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(blocks)]
    )


def _trainer(model: nn.Module, x: torch.Tensor) -> Callable[[], None]:
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step() -> None:
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def measure(steps: int = 5, blocks: int = 6, width: int = 256, batch: int = 32) -> dict[str, Any]:
    """Return, per workload, host copies and host bytes allocated per step (after warm-up)."""
    forced = offload_transfer.copies_needed
    offload_transfer.copies_needed = lambda device, home: True  # type: ignore[assignment]
    try:
        backend = PinCountingBackend()
        x = torch.randn(batch, width, generator=torch.Generator().manual_seed(1))
        handles = []

        def sliced() -> Callable[[], None]:
            model = OffloadModel(
                _model(blocks, width), num_slices=3, checkpoint_activation=True, backend=backend
            )
            return _trainer(model, x)

        def hooked() -> Callable[[], None]:
            model = _model(blocks, width)
            handles.append(offload_parameters(model, backend=backend))
            return _trainer(model, x)

        def checkpointed() -> Callable[[], None]:
            def step() -> None:
                # What checkpoint_wrapper(offload_to_cpu=True) does with each block's input.
                for _ in range(blocks):
                    restore(copy_to_host(x, backend), backend)

            return step

        workloads: dict[str, Callable[[], Callable[[], None]]] = {
            "OffloadModel(num_slices=3, checkpoint_activation=True)": sliced,
            "offload_parameters(model)": hooked,
            "checkpoint offload_to_cpu (one input per block)": checkpointed,
        }
        results: dict[str, Any] = {}
        for name, build in workloads.items():
            backend.reset()
            step = build()
            step()  # pools and packed parameters are made here, once
            setup = (backend.copies, backend.allocated_bytes)
            backend.reset()
            for _ in range(steps):
                step()
            results[name] = {
                "setup_host_copies": setup[0],
                "setup_host_allocated_bytes": setup[1],
                "host_copies_per_step": backend.copies / steps,
                "host_copied_bytes_per_step": backend.copied_bytes / steps,
                "host_allocated_bytes_per_step": backend.allocated_bytes / steps,
            }
        for handle in handles:
            handle.remove()
        return {
            "steps": steps,
            "model": {"blocks": blocks, "width": width, "batch": batch},
            "workloads": results,
        }
    finally:
        offload_transfer.copies_needed = forced  # type: ignore[assignment]
