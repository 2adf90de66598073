"""Run by torchrun (2 processes, cpu): offload.Engine with gradient accumulation under DDP.

Counts the all-reduces DDP issues at each micro-step (through a communication hook), and
saves them with the final parameters, next to those of this process alone on the full
batch, to ``$ACCEL_TEST_OUT/rank<RANK>.pt``; tests/accel/test_distributed.py compares.
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations at run time.
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

import accel.distributed
from offload import Engine

MICRO_STEPS = 6
ACCUMULATION = 3


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [
        (torch.randn(8, 6, generator=generator), torch.randn(8, 3, generator=generator))
        for _ in range(MICRO_STEPS)
    ]


def fresh_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def train(model: nn.Module, rows: slice) -> list[torch.Tensor]:
    engine = Engine(
        model, torch.optim.SGD(model.parameters(), lr=0.1), gradient_accumulation_steps=ACCUMULATION
    )
    for x, y in batches():
        loss = nn.functional.mse_loss(engine(x[rows]), y[rows])
        engine.backward(loss)
        engine.step()
    return [p.detach().clone() for p in model.parameters()]


def main() -> None:
    accel.distributed.init_process_group()
    rank = dist.get_rank()
    reduces: list[int] = []

    def counting_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        reduces[-1] += 1
        return allreduce_hook(state, bucket)

    model = fresh_model()
    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(None, counting_hook)
    engine = Engine(
        ddp, torch.optim.SGD(model.parameters(), lr=0.1), gradient_accumulation_steps=ACCUMULATION
    )
    half = slice(4 * rank, 4 * rank + 4)
    for x, y in batches():
        reduces.append(0)
        engine.backward(nn.functional.mse_loss(engine(x[half]), y[half]))
        engine.step()
    distributed = [p.detach().clone() for p in model.parameters()]
    alone = train(fresh_model(), slice(None))
    out = Path(os.environ["ACCEL_TEST_OUT"])
    torch.save(
        {"reduces": reduces, "distributed": distributed, "alone": alone}, out / f"rank{rank}.pt"
    )
    dist.barrier()
    dist.destroy_process_group()
    # Leave before main's locals are freed. Freeing the DDP reducer drops the last
    # reference to the gloo process group, whose destructor joins its worker threads
    # while holding the GIL; a worker still releasing the Python comm hook's future
    # callback waits for the GIL: a deadlock (seen in CI on a loaded machine,
    # 2026-11-27: rank 0 hung in ~ProcessGroupGloo after both ranks had saved).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
