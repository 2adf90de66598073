"""Today's offloading peers for bench_offload.py: FSDP2 with CPU offload, DeepSpeed ZeRO-3.

Each peer trains the same blocks (every block checkpointed, one FSDP unit or ZeRO-3
module per block) and is timed like ours: forward plus backward, then the same host
optimizer step apart. Where a peer cannot run, its record says why instead of raising:

* FSDP2 (``fully_shard(..., offload_policy=CPUOffloadPolicy())``) runs in this process
  on a single-process group of world size 1 (NCCL on CUDA, gloo on the host). On a
  host without an accelerator torch refuses to pin the shards ("Cannot access
  accelerator device when none is available", torch 2.13); the smoke run records that
  and runs the same code with ``pin_memory=False``, so its path is still exercised.
* DeepSpeed ZeRO-3 (``offload_param`` and ``offload_optimizer`` on ``cpu``) runs in a
  child process with a time limit (``bench_offload.py --peer deepspeed``), so that an
  op build or a hang in it can never take the other figures with it. Only where
  ``import deepspeed`` works and the device is CUDA: on the host, DeepSpeed 0.19.8's
  CPU accelerator did not return from ``deepspeed.initialize`` within 5 minutes
  (2026-11-27), so the smoke run records it as not attempted.

FSDP2 trains the whole batch in one pass (how it is used), ours in micro-batches: both
move every parameter to the device twice per step (forward, then backward).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

#: FSDP2's error on a host with no accelerator when asked to pin its shards (torch 2.13).
PIN_REFUSAL = "Cannot access accelerator device"


class Checkpointed(nn.Module):
    """One block, recomputed in backward (torch's non-reentrant checkpoint)."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.block, x, use_reentrant=False)  # type: ignore[no-any-return]


def checkpointed_blocks(reference: nn.Sequential) -> nn.Sequential:
    """The same blocks, each one checkpointed: the unit FSDP2 and ZeRO-3 shard by."""
    return nn.Sequential(*[Checkpointed(block) for block in reference])


def fsdp2_api() -> tuple[Any, Any]:
    """``fully_shard`` and ``CPUOffloadPolicy``, wherever this torch keeps them."""
    try:
        from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
    except ImportError:  # torch 2.4 and 2.5 had them under _composable.fsdp only
        from torch.distributed._composable.fsdp import (  # type: ignore[no-redef,attr-defined,unused-ignore]
            CPUOffloadPolicy,
            fully_shard,
        )
    return fully_shard, CPUOffloadPolicy


@contextmanager
def single_process_group(device_type: str) -> Iterator[None]:
    """A process group of world size 1 (NCCL on CUDA, else gloo), destroyed on leaving."""
    backend = "nccl" if device_type == "cuda" else "gloo"
    made = not dist.is_initialized()
    if made:
        store = dist.HashStore()  # type: ignore[attr-defined]
        dist.init_process_group(backend, store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        if made:
            dist.destroy_process_group()


def build_fsdp2(
    reference: nn.Sequential, device: torch.device, *, pin_memory: bool = True
) -> nn.Module:
    """FSDP2 over checkpointed copies of the blocks, parameters offloaded to host memory."""
    import copy

    from torch.distributed.device_mesh import init_device_mesh

    fully_shard, policy = fsdp2_api()
    mesh = init_device_mesh(device.type, (1,))
    model = checkpointed_blocks(copy.deepcopy(reference))
    for unit in model:
        fully_shard(unit, mesh=mesh, offload_policy=policy(pin_memory=pin_memory))
    fully_shard(model, mesh=mesh, offload_policy=policy(pin_memory=pin_memory))
    return model


def first_line(exc: BaseException) -> str:
    """An exception as one short line: its type and its message's first line."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:300] if text else ''}".rstrip(": ")


def deepspeed_status(device_type: str) -> str | None:
    """Why DeepSpeed is not attempted here, or ``None`` when it is (it is not imported here)."""
    if importlib.util.find_spec("deepspeed") is None:
        return "not installed: no module named deepspeed"
    if device_type != "cuda":
        return (
            "not attempted: ZeRO-3 offload is timed only on CUDA (on the host, DeepSpeed "
            "0.19.8's initialize did not return within 5 minutes)"
        )
    return None


def run_deepspeed_child(
    script: Path, options: list[str], timeout_s: float, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run ``script --peer deepspeed`` and return the JSON record on its last stdout line."""
    command = [sys.executable, str(script), "--peer", "deepspeed", *options]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        return {"result": f"timed out after {timeout_s:.0f} s (its child process was killed)"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode == 0 and lines:
        record: dict[str, Any] = json.loads(lines[-1])
        return record
    tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1][:300]
    return {"result": f"failed with exit status {done.returncode}: {tail}"}


def deepspeed_engine(
    build: Callable[[], nn.Sequential], optimizer_factory: Callable[..., Any]
) -> Any:
    """A ZeRO-3 engine with parameters and optimizer state offloaded to pinned host memory.

    The blocks are built inside ``deepspeed.zero.Init`` on the host, so that they are
    partitioned as they are made: the whole model never has to fit the device's cap.
    """
    import deepspeed

    os.environ.update(
        {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    )
    os.environ.setdefault("MASTER_PORT", "29517")
    deepspeed.init_distributed()
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {
            "stage": 3,
            "offload_param": {"device": "cpu", "pin_memory": True},
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
        },
        # The same torch optimizer as every other wrapper, not DeepSpeed's CPU Adam.
        "zero_force_ds_cpu_optimizer": False,
        "zero_allow_untested_optimizer": True,
    }
    with deepspeed.zero.Init(remote_device="cpu", pin_memory=True, config_dict_or_path=config):
        model = checkpointed_blocks(build())
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=optimizer_factory(model.parameters()), config=config
    )
    return engine
