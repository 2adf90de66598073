"""Where this process sits in a torchrun launch: rank, world size, local rank, device.

Read from the launcher's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) or from explicit arguments, and
checked before anything is initialised, for :func:`accel.distributed.init_process_group`.
Every error starts with ``accel.distributed:`` and says what to set.
"""

from __future__ import annotations

import os

from ._errors import DistributedSetupError
from ._protocol import Accelerator

__all__ = [
    "check_local_rank_at_creation",
    "check_rendezvous",
    "device_index",
    "distributed_error",
    "local_layout",
    "rank_and_world_size",
    "raise_local_rank_at_creation",
]

_PREFIX = "accel.distributed: "
_LAUNCH_HINT = (
    "Launch with torchrun (python -m torch.distributed.run --nproc_per_node=N script.py), "
    "which sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT"
)


def distributed_error(message: str) -> DistributedSetupError:
    return DistributedSetupError(_PREFIX + message)


def _env_int(name: str) -> int | None:
    """Return the integer in environment variable ``name``, ``None`` if it is unset."""
    raw = os.environ.get(name)
    if raw is None:
        return None
    try:
        return int(raw.strip())
    except ValueError:
        raise distributed_error(
            f"the environment variable {name} is {raw!r}, which is not an integer. "
            f"Set it to a whole number, or unset it; {_LAUNCH_HINT}."
        ) from None


def _explicit_int(name: str, value: object, unset: int | None) -> int | None:
    """Return a keyword argument's value, ``None`` if it was left at ``unset``."""
    if value is None or (unset is not None and value == unset and type(value) is int):
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise distributed_error(f"{name}={value!r} is not an integer; pass a whole number.")
    return value


def rank_and_world_size(rank: int, world_size: int) -> tuple[int, int]:
    explicit_rank = _explicit_int("rank", rank, -1)
    explicit_world = _explicit_int("world_size", world_size, -1)
    rank_value = explicit_rank if explicit_rank is not None else _env_int("RANK")
    world_value = explicit_world if explicit_world is not None else _env_int("WORLD_SIZE")
    rank_source = "rank=" if explicit_rank is not None else "RANK="
    world_source = "world_size=" if explicit_world is not None else "WORLD_SIZE="
    if rank_value is None and world_value is None:
        raise distributed_error(
            "RANK and WORLD_SIZE are not set, so this process does not know its place in "
            f"the job. {_LAUNCH_HINT}; or pass rank= and world_size= explicitly."
        )
    if world_value is None:
        raise distributed_error(
            f"{rank_source}{rank_value} is set but WORLD_SIZE is not; both are needed. "
            f"Set WORLD_SIZE to the number of processes in the job (or pass world_size=); "
            f"{_LAUNCH_HINT}."
        )
    if rank_value is None:
        raise distributed_error(
            f"{world_source}{world_value} is set but RANK is not; both are needed. Set RANK "
            f"to this process's rank, 0..{world_value - 1} (or pass rank=); {_LAUNCH_HINT}."
        )
    if world_value < 1:
        raise distributed_error(
            f"{world_source}{world_value} is not a valid world size; it must be at least 1 "
            "(the number of processes in the job)."
        )
    if not 0 <= rank_value < world_value:
        raise distributed_error(
            f"{rank_source}{rank_value} is outside the job: with {world_source}{world_value} "
            f"ranks run from 0 to {world_value - 1}. Check the launcher's settings; every "
            "process needs a different rank below the world size."
        )
    return rank_value, world_value


def local_layout(local_rank: int | None, world_size: int) -> tuple[int, int | None]:
    """Return this process's local rank and the number of processes on this node."""
    explicit = _explicit_int("local_rank", local_rank, None)
    value = explicit if explicit is not None else _env_int("LOCAL_RANK")
    source = "local_rank=" if explicit is not None else "LOCAL_RANK="
    if value is None:
        if world_size == 1:
            value = 0
        else:
            raise distributed_error(
                f"LOCAL_RANK is not set, so the device of this process (one of "
                f"{world_size}) is unknown. {_LAUNCH_HINT}; or pass local_rank= (the "
                "process's index on its node, 0 for the first)."
            )
    if not 0 <= value < world_size:
        raise distributed_error(
            f"{source}{value} is not a valid local rank for a job of {world_size} "
            f"process(es); it must be between 0 and {world_size - 1}."
        )
    local_world_size = _env_int("LOCAL_WORLD_SIZE")
    if local_world_size is not None:
        if not 1 <= local_world_size <= world_size:
            raise distributed_error(
                f"LOCAL_WORLD_SIZE={local_world_size} is inconsistent with WORLD_SIZE="
                f"{world_size}: a node runs between 1 and {world_size} processes. Fix the "
                "launcher's settings, or unset LOCAL_WORLD_SIZE."
            )
        if value >= local_world_size:
            raise distributed_error(
                f"{source}{value} is not below LOCAL_WORLD_SIZE={local_world_size}, the "
                f"number of processes on this node; local ranks run from 0 to "
                f"{local_world_size - 1}. Fix the launcher's settings."
            )
    return value, local_world_size


def device_index(backend: Accelerator, local_rank: int, local_world_size: int | None) -> int:
    """Return the device index this process binds (see the module docstring)."""
    count = backend.device_count()
    if count < 1:
        raise distributed_error(
            f"backend {backend.name!r} sees no device in this process (device_count() is "
            f"{count}), so LOCAL_RANK={local_rank} has nothing to bind. Check the "
            "visible-devices environment variable, or run `python -m accel`."
        )
    if count == 1:
        return 0
    local_processes = max(local_rank + 1, local_world_size or 0)
    if local_processes > count:
        what = (
            f"LOCAL_RANK={local_rank}"
            if local_world_size is None or local_rank >= count
            else f"LOCAL_WORLD_SIZE={local_world_size}"
        )
        raise distributed_error(
            f"{what} needs more devices than this process sees: backend {backend.name!r} "
            f"has {count} visible device(s) (indices 0..{count - 1}). Launch at most {count} "
            "processes per node (torchrun --nproc_per_node), or make more devices visible."
        )
    return local_rank


def check_local_rank_at_creation(backend: Accelerator, local_rank: int, world_size: int) -> None:
    """A backend that binds its device when created took it from ``LOCAL_RANK`` then."""
    if world_size == 1:
        return
    from ._select import local_rank_at_creation

    recorded, seen = local_rank_at_creation(backend.name)
    if recorded and seen != local_rank:
        raise_local_rank_at_creation(backend.name, "unset" if seen is None else seen, local_rank)


def raise_local_rank_at_creation(name: str, seen: object, local_rank: int) -> None:
    raise distributed_error(
        f"LOCAL_RANK was {seen} when the {name} backend was created, but this process's "
        f"local rank is {local_rank}. The {name} backend binds its device from LOCAL_RANK "
        "when it is created (Habana's bridge, for hpu, takes its card, HLS_MODULE_ID, when "
        f"it is imported), so this process would use another device. Set "
        f"LOCAL_RANK={local_rank} in the environment before the first accel.get_backend() "
        "(torchrun does), or pass no local_rank=."
    )


def check_rendezvous(init_method: str | None, store: object) -> None:
    if store is not None or (init_method is not None and not init_method.startswith("env://")):
        return
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name)]
    if missing:
        raise distributed_error(
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set, and the "
            f"env:// rendezvous (init_method={init_method!r}) needs both to reach rank 0. "
            f"{_LAUNCH_HINT}; or set them (e.g. MASTER_ADDR=127.0.0.1 MASTER_PORT=29500), or "
            "pass another init_method (tcp://host:port, file:///path) or a store."
        )
    port = _env_int("MASTER_PORT")
    if port is None or not 1 <= port <= 65535:
        raise distributed_error(
            f"MASTER_PORT={port} is not a TCP port; set it to a free port between 1 and 65535."
        )
