"""Run by torchrun (2 processes, cpu): FSDP2 (fully_shard) with our checkpoint.

A small causal transformer; every block is wrapped by
``checkpointing.apply_activation_checkpointing`` and then sharded with
``accel.distributed.fully_shard`` (torch's FSDP2 on every release). Each rank trains on
half of each batch for a few SGD steps; the job's loss per step (the mean of the ranks'
losses) and the final parameters are saved next to those of this process alone, on the
full batch, without FSDP and without checkpointing, to
``$ACCEL_TEST_OUT/rank<RANK>.pt``. tests/accel/test_distributed.py compares.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import accel.distributed
from accel.distributed import fully_shard
from checkpointing import CheckpointWrapper, apply_activation_checkpointing, is_recomputing

VOCAB, WIDTH, HEADS, LAYERS, STEPS = 32, 16, 2, 2, 4
RECOMPUTED: list[str] = []  # one entry per block forward run again in backward


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.norm2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(
            nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if is_recomputing():
            RECOMPUTED.append(type(self).__name__)
        batch, length, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (t.view(batch, length, HEADS, -1).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, WIDTH))
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Return the next-token loss (a scalar: FSDP2 warns when a root returns a view)."""
        x = self.embed(tokens[:, :-1])
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def train(model: nn.Module, batches: list[torch.Tensor], distributed: bool) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for tokens in batches:
        optimizer.zero_grad()
        loss = model(tokens)
        loss.backward()
        optimizer.step()
        job_loss = loss.detach().clone()
        if distributed:
            dist.all_reduce(job_loss, op=dist.ReduceOp.AVG)
        losses.append(job_loss.item())
    return losses


def full_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    return {
        name.replace("._checkpoint_wrapped_module", ""): (
            p.full_tensor() if hasattr(p, "full_tensor") else p
        )
        .detach()
        .clone()
        for name, p in model.named_parameters()
    }


def main() -> None:
    torch.set_num_threads(1)
    accel.distributed.init_process_group()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    generator = torch.Generator().manual_seed(5)
    full = [torch.randint(0, VOCAB, (8, 9), generator=generator) for _ in range(STEPS)]
    per_rank = len(full[0]) // world_size
    mine = [tokens[rank * per_rank : (rank + 1) * per_rank] for tokens in full]

    torch.manual_seed(0)
    reference_model = TinyTransformer()
    reference_losses = train(reference_model, full, distributed=False)
    assert not RECOMPUTED
    results: dict[str, object] = {"single": full_parameters(reference_model)}
    results["single_losses"] = reference_losses
    for name, use_reentrant in (("reentrant", True), ("non_reentrant", False)):
        torch.manual_seed(0)
        RECOMPUTED.clear()
        model = TinyTransformer()
        wrapped = apply_activation_checkpointing(
            model, lambda m: isinstance(m, Block), use_reentrant=use_reentrant
        )
        for block in model.blocks:
            assert isinstance(block, CheckpointWrapper)
            fully_shard(block)
        fully_shard(model)
        losses = train(model, mine, distributed=True)
        results[name] = {
            "wrapped": wrapped,
            "losses": losses,
            "recomputed": len(RECOMPUTED),
            "params": full_parameters(model),
            "sharded": [type(p).__name__ for p in model.parameters()],
        }

    dist.barrier()
    dist.destroy_process_group()
    torch.save(results, Path(os.environ["ACCEL_TEST_OUT"]) / f"rank{rank}.pt")


if __name__ == "__main__":
    main()
