"""Double of ``habana_frameworks.torch.distributed.hccl``.

Like the bridge's module, importing it (which ``import habana_frameworks.torch`` does):

* copies ``OMPI_COMM_WORLD_{LOCAL_RANK,SIZE,RANK}`` to ``LOCAL_RANK``/``WORLD_SIZE``/
  ``RANK`` when all three Open MPI variables are set and the torchrun ones are not, and
  writes ``MASTER_ADDR=localhost``/``MASTER_PORT=12345`` where they are unset;
* sets ``HLS_MODULE_ID`` (the card this process acquires) when it is unset,
  ``LOCAL_RANK`` is set and ``WORLD_SIZE`` > 1: ``HABANA_VISIBLE_MODULES``'s entry at
  ``LOCAL_RANK``, else ``LOCAL_RANK`` itself;
* sets ``ID`` to ``RANK`` when ``RANK`` is set;
* registers ``hccl`` as a ``torch.distributed`` backend for hpu devices (process-wide;
  torch offers no way to undo it).

The import is recorded as ``"hccl.import"``. The double cannot create process groups:
``init_process_group("hccl")`` raises ``RuntimeError``.
"""

from __future__ import annotations

import os
from typing import Any, NoReturn

import torch.distributed as dist

from habana_frameworks import _double
from habana_frameworks.torch.hpu import HABANA_VISIBLE_MODULES_VAR, HLS_MODULE_ID_VAR

__all__ = ["initialize_distributed_hpu"]

_FROM_MPI = {
    "OMPI_COMM_WORLD_LOCAL_RANK": "LOCAL_RANK",
    "OMPI_COMM_WORLD_SIZE": "WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK": "RANK",
}


def _create_process_group(*args: Any, **kwargs: Any) -> NoReturn:
    raise RuntimeError("the habana_frameworks test double cannot create hccl process groups")


def _environment_from_mpi() -> None:
    if all(name in os.environ for name in _FROM_MPI.values()):
        return
    if all(name in os.environ for name in _FROM_MPI):
        for mpi_name, name in _FROM_MPI.items():
            _double.setenv(name, os.environ[mpi_name])
    if os.environ.get("MASTER_ADDR") is None:
        _double.setenv("MASTER_ADDR", "localhost")
    if os.environ.get("MASTER_PORT") is None:
        _double.setenv("MASTER_PORT", "12345")


def _module_id(local_rank: int, world_size: int) -> None:
    if HLS_MODULE_ID_VAR in os.environ or local_rank == -1 or world_size == 1:
        return
    visible = os.environ.get(HABANA_VISIBLE_MODULES_VAR)
    if visible is not None:
        modules = visible.split(",")
        assert local_rank < len(modules), (
            f"There is not enough devices available for training. Please verify if "
            f"{HABANA_VISIBLE_MODULES_VAR} is set correctly."
        )
        _double.setenv(HLS_MODULE_ID_VAR, modules[local_rank])
        return
    _double.setenv(HLS_MODULE_ID_VAR, str(local_rank))


def initialize_distributed_hpu() -> tuple[int, int, int]:
    """Read the launcher's variables and pick this process's card; return the layout."""
    _environment_from_mpi()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "-1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "-1"))
    _module_id(local_rank, world_size)
    if rank != -1:
        _double.setenv("ID", str(rank))
    return world_size, rank, local_rank


_double.record("hccl.import")
initialize_distributed_hpu()
if dist.is_available() and "hccl" not in dist.Backend.backend_list:
    dist.Backend.register_backend("hccl", _create_process_group, devices=["hpu"])
