"""Run by torchrun (2 processes, cpu): accel.distributed.init_process_group, then DDP.

Records what init_process_group set up, and for each checkpoint variant the gradients
and parameters of a few SGD steps under DistributedDataParallel (each rank on half the
batch) next to those of this process alone on the full batch. Everything is saved to
``$ACCEL_TEST_OUT/rank<RANK>.pt``; tests/accel/test_distributed.py compares.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import accel.distributed
from checkpointing import checkpoint, is_recomputing

STEPS = 3
RECOMPUTED: list[str] = []  # one entry per checkpointed call run again in backward


class Net(nn.Module):
    def __init__(self, use_reentrant: bool) -> None:
        super().__init__()
        self.embed = nn.Linear(6, 16)
        self.block1 = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 16))
        self.block2 = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16))
        self.head = nn.Linear(16, 3)
        self.use_reentrant = use_reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = checkpoint(self.run_block1, self.embed(x), use_reentrant=self.use_reentrant)
        h = checkpoint(self.block2, h, use_reentrant=self.use_reentrant)
        return self.head(h)

    def run_block1(self, x: torch.Tensor) -> torch.Tensor:
        if is_recomputing():
            RECOMPUTED.append("block1")
        return self.block1(x)


def train(
    model: nn.Module, batches: list[torch.Tensor], distributed: bool
) -> dict[str, list[torch.Tensor]]:
    module = DistributedDataParallel(model) if distributed else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    grads = []
    for x in batches:
        optimizer.zero_grad()
        module(x).pow(2).mean().backward()
        grads.extend(p.grad.clone() for p in model.parameters() if p.grad is not None)
        optimizer.step()
    return {"grads": grads, "params": [p.detach().clone() for p in model.parameters()]}


def main() -> None:
    torch.set_num_threads(1)
    backend = accel.distributed.init_process_group()
    rank = dist.get_rank()
    world_size = dist.get_world_size()
    ranks = torch.tensor([float(rank)])
    dist.all_reduce(ranks)
    setup = {
        "env_rank": int(os.environ["RANK"]),
        "env_local_rank": int(os.environ["LOCAL_RANK"]),
        "rank": rank,
        "world_size": world_size,
        "accel_rank": accel.distributed.get_rank(),
        "accel_world_size": accel.distributed.get_world_size(),
        "communication": dist.get_backend(),
        "accel_backend": backend.name,
        "current_device": backend.current_device(),
        "device": str(backend.device()),
        "rank_sum": ranks.item(),
    }

    generator = torch.Generator().manual_seed(3)
    full = [torch.randn(8, 6, generator=generator) for _ in range(STEPS)]
    half = [x[rank * 4 : (rank + 1) * 4] for x in full]
    results: dict[str, object] = {"setup": setup}
    for name, use_reentrant in (("reentrant", True), ("non_reentrant", False)):
        torch.manual_seed(0)
        reference = train(Net(use_reentrant), full, distributed=False)
        torch.manual_seed(0)
        RECOMPUTED.clear()
        candidate = train(Net(use_reentrant), half, distributed=True)
        results[name] = {"ddp": candidate, "single": reference, "recomputed": len(RECOMPUTED)}

    dist.barrier()
    dist.destroy_process_group()
    results["initialized_after_destroy"] = dist.is_initialized()
    torch.save(results, Path(os.environ["ACCEL_TEST_OUT"]) / f"rank{rank}.pt")


if __name__ == "__main__":
    main()
