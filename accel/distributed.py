"""Start ``torch.distributed`` on any backend: the right communication library and device.

:func:`init_process_group` is a drop-in for :func:`torch.distributed.init_process_group`
that also does what differs between devices: it runs the backend's
``prepare_distributed()`` (Gaudi registers ``hccl`` there), picks the backend's
``communication_backend`` (``gloo``, ``nccl``, ``hccl``...), reads and checks the
environment torchrun sets, and binds this process to its device before the process group
exists. Communication itself is torch's; nothing here sends a byte.

Example (``torchrun --nproc_per_node=8 train.py``)::

    import accel.distributed

    backend = accel.distributed.init_process_group()
    model = torch.nn.parallel.DistributedDataParallel(model.to(backend.device()))
    ...
    torch.distributed.destroy_process_group()

The environment it reads (torchrun sets all of it): ``RANK`` and ``WORLD_SIZE``, required
together unless passed as ``rank=`` and ``world_size=``; ``LOCAL_RANK``, required when
``WORLD_SIZE`` > 1 unless passed as ``local_rank=``; ``LOCAL_WORLD_SIZE``, checked when
set; ``MASTER_ADDR`` and ``MASTER_PORT`` for the default ``env://`` rendezvous.

Which device a process binds, from ``n = backend.device_count()`` (devices this process
sees) and its local rank ``r``:

* ``n == 1``: index 0. The process has one device of its own (``CUDA_VISIBLE_DEVICES``
  or ``HABANA_VISIBLE_MODULES`` set per process) or shares one with the other local
  processes (the host CPU).
* ``n > 1``: index ``r``, the usual one-process-per-device layout (every index below
  ``device_count()`` is usable, as the protocol requires). More local processes (``r``,
  or ``LOCAL_WORLD_SIZE``) than visible devices is an error.

Gaudi (``hpu``) reports one device per process, so it always binds index 0: Habana's
bridge chooses the card (``HLS_MODULE_ID``) from ``LOCAL_RANK`` when it is imported, which
is when the hpu backend is created (or earlier, at ``import torch``, where the bridge
autoloads). ``LOCAL_RANK`` must therefore be in the environment before the first
``accel.get_backend()``; torchrun sets it at process start. :func:`init_process_group`
checks that the hpu backend was created with this process's local rank.

This module is not imported by ``import accel``; import it as ``import accel.distributed``.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ._compat import FSDP2_MIN_RELEASE_OFF_CUDA, fsdp2_fully_shard, torch_release
from ._errors import DistributedSetupError
from ._protocol import Accelerator

if TYPE_CHECKING:
    from torch.distributed.distributed_c10d import Store

__all__ = [
    "DistributedSetupError",
    "fully_shard",
    "get_rank",
    "get_world_size",
    "init_process_group",
]

_PREFIX = "accel.distributed: "
_LAUNCH_HINT = (
    "Launch with torchrun (python -m torch.distributed.run --nproc_per_node=N script.py), "
    "which sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT"
)


def _error(message: str) -> DistributedSetupError:
    return DistributedSetupError(_PREFIX + message)


def _env_int(name: str) -> int | None:
    """Return the integer in environment variable ``name``, ``None`` if it is unset."""
    raw = os.environ.get(name)
    if raw is None:
        return None
    try:
        return int(raw.strip())
    except ValueError:
        raise _error(
            f"the environment variable {name} is {raw!r}, which is not an integer. "
            f"Set it to a whole number, or unset it; {_LAUNCH_HINT}."
        ) from None


def _explicit_int(name: str, value: object, unset: int | None) -> int | None:
    """Return a keyword argument's value, ``None`` if it was left at ``unset``."""
    if value is None or (unset is not None and value == unset and type(value) is int):
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _error(f"{name}={value!r} is not an integer; pass a whole number.")
    return value


def _rank_and_world_size(rank: int, world_size: int) -> tuple[int, int]:
    explicit_rank = _explicit_int("rank", rank, -1)
    explicit_world = _explicit_int("world_size", world_size, -1)
    rank_value = explicit_rank if explicit_rank is not None else _env_int("RANK")
    world_value = explicit_world if explicit_world is not None else _env_int("WORLD_SIZE")
    rank_source = "rank=" if explicit_rank is not None else "RANK="
    world_source = "world_size=" if explicit_world is not None else "WORLD_SIZE="
    if rank_value is None and world_value is None:
        raise _error(
            "RANK and WORLD_SIZE are not set, so this process does not know its place in "
            f"the job. {_LAUNCH_HINT}; or pass rank= and world_size= explicitly."
        )
    if world_value is None:
        raise _error(
            f"{rank_source}{rank_value} is set but WORLD_SIZE is not; both are needed. "
            f"Set WORLD_SIZE to the number of processes in the job (or pass world_size=); "
            f"{_LAUNCH_HINT}."
        )
    if rank_value is None:
        raise _error(
            f"{world_source}{world_value} is set but RANK is not; both are needed. Set RANK "
            f"to this process's rank, 0..{world_value - 1} (or pass rank=); {_LAUNCH_HINT}."
        )
    if world_value < 1:
        raise _error(
            f"{world_source}{world_value} is not a valid world size; it must be at least 1 "
            "(the number of processes in the job)."
        )
    if not 0 <= rank_value < world_value:
        raise _error(
            f"{rank_source}{rank_value} is outside the job: with {world_source}{world_value} "
            f"ranks run from 0 to {world_value - 1}. Check the launcher's settings; every "
            "process needs a different rank below the world size."
        )
    return rank_value, world_value


def _local_layout(local_rank: int | None, world_size: int) -> tuple[int, int | None]:
    """Return this process's local rank and the number of processes on this node."""
    explicit = _explicit_int("local_rank", local_rank, None)
    value = explicit if explicit is not None else _env_int("LOCAL_RANK")
    source = "local_rank=" if explicit is not None else "LOCAL_RANK="
    if value is None:
        if world_size == 1:
            value = 0
        else:
            raise _error(
                f"LOCAL_RANK is not set, so the device of this process (one of "
                f"{world_size}) is unknown. {_LAUNCH_HINT}; or pass local_rank= (the "
                "process's index on its node, 0 for the first)."
            )
    if not 0 <= value < world_size:
        raise _error(
            f"{source}{value} is not a valid local rank for a job of {world_size} "
            f"process(es); it must be between 0 and {world_size - 1}."
        )
    local_world_size = _env_int("LOCAL_WORLD_SIZE")
    if local_world_size is not None:
        if not 1 <= local_world_size <= world_size:
            raise _error(
                f"LOCAL_WORLD_SIZE={local_world_size} is inconsistent with WORLD_SIZE="
                f"{world_size}: a node runs between 1 and {world_size} processes. Fix the "
                "launcher's settings, or unset LOCAL_WORLD_SIZE."
            )
        if value >= local_world_size:
            raise _error(
                f"{source}{value} is not below LOCAL_WORLD_SIZE={local_world_size}, the "
                f"number of processes on this node; local ranks run from 0 to "
                f"{local_world_size - 1}. Fix the launcher's settings."
            )
    return value, local_world_size


def _device_index(backend: Accelerator, local_rank: int, local_world_size: int | None) -> int:
    """Return the device index this process binds (see the module docstring)."""
    count = backend.device_count()
    if count < 1:
        raise _error(
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
        raise _error(
            f"{what} needs more devices than this process sees: backend {backend.name!r} "
            f"has {count} visible device(s) (indices 0..{count - 1}). Launch at most {count} "
            "processes per node (torchrun --nproc_per_node), or make more devices visible."
        )
    return local_rank


def _check_hpu_local_rank(backend: Accelerator, local_rank: int, world_size: int) -> None:
    """hpu: the bridge bound its card from ``LOCAL_RANK`` when the backend was created."""
    if backend.device_type != "hpu" or world_size == 1:
        return
    missing = object()
    seen = getattr(backend, "local_rank_at_creation", missing)
    if seen is missing or seen == local_rank:
        return
    _raise_hpu_local_rank("unset" if seen is None else seen, local_rank)


def _raise_hpu_local_rank(seen: object, local_rank: int) -> None:
    raise _error(
        f"LOCAL_RANK was {seen} when the hpu backend was created, but this process's local "
        f"rank is {local_rank}. Habana's bridge chooses the card (HLS_MODULE_ID) from "
        "LOCAL_RANK when it is imported, which is when the backend is created, so this "
        f"process would use another card. Set LOCAL_RANK={local_rank} in the environment "
        "before the first accel.get_backend() (torchrun does), or pass no local_rank=."
    )


def _check_rendezvous(init_method: str | None, store: object) -> None:
    if store is not None or (init_method is not None and not init_method.startswith("env://")):
        return
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name)]
    if missing:
        raise _error(
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set, and the "
            f"env:// rendezvous (init_method={init_method!r}) needs both to reach rank 0. "
            f"{_LAUNCH_HINT}; or set them (e.g. MASTER_ADDR=127.0.0.1 MASTER_PORT=29500), or "
            "pass another init_method (tcp://host:port, file:///path) or a store."
        )
    port = _env_int("MASTER_PORT")
    if port is None or not 1 <= port <= 65535:
        raise _error(
            f"MASTER_PORT={port} is not a TCP port; set it to a free port between 1 and 65535."
        )


def _article(noun: str) -> str:
    return f"{'an' if noun[:1] in 'aeiou' else 'a'} {noun}"


def _check_communication_backend(backend: object, accel_backend: Accelerator) -> None:
    """Refuse a ``backend=`` torch would only reject deep inside, with a bare assertion."""
    if backend is None:
        return
    own = accel_backend.communication_backend
    hint = (
        f"Pass None to use {accel_backend.name}'s own {own!r}, a name torch.distributed "
        "knows, or device:backend pairs such as 'cpu:gloo,cuda:nccl'."
    )
    if not isinstance(backend, str):
        raise _error(
            f"backend={backend!r} is {_article(type(backend).__name__)}, not a str naming a "
            f"torch.distributed backend. {hint}"
        )
    known = [name for name in dist.Backend.backend_list if name != "undefined"]
    names = [part.split(":", 1)[-1].strip() for part in backend.lower().split(",")]
    unknown = [name for name in names if name not in known and name != own]
    if unknown or not names:
        raise _error(
            f"backend={backend!r} names no torch.distributed backend this process knows "
            f"({', '.join(unknown) or 'empty'}); known here: {', '.join(known)}. {hint}"
        )


def init_process_group(
    backend: str | None = None,
    init_method: str | None = None,
    timeout: timedelta | None = None,
    world_size: int = -1,
    rank: int = -1,
    store: Store | None = None,
    *,
    accel_backend: Accelerator | None = None,
    local_rank: int | None = None,
    **kwargs: Any,
) -> Accelerator:
    """Initialise the default process group for this process's accelerator.

    Takes :func:`torch.distributed.init_process_group`'s arguments, in its order. In
    this order, it checks the environment and that no default process group exists,
    calls ``accel_backend.prepare_distributed()``, binds the device with
    ``accel_backend.set_device(index)`` (the index rule is in the module docstring),
    then calls :func:`torch.distributed.init_process_group` with the communication
    backend, ``rank`` and ``world_size`` resolved, and every other argument as given.

    Example::

        import accel.distributed

        backend = accel.distributed.init_process_group()  # under torchrun
        model = model.to(backend.device())

    Args:
        backend: The ``torch.distributed`` backend; ``None`` means
            ``accel_backend.communication_backend`` (``gloo`` on cpu, ``nccl`` on cuda,
            ``hccl`` on hpu).
        init_method: Passed on; ``None`` is torch's default, ``env://``.
        timeout: Passed on (``None``: torch's default).
        world_size: The number of processes; ``-1`` reads ``WORLD_SIZE``.
        rank: This process's rank; ``-1`` reads ``RANK``.
        store: Passed on; with a store, ``MASTER_ADDR``/``MASTER_PORT`` are not needed.
        accel_backend: The accelerator to set up; ``None`` means :func:`accel.get_backend`.
        local_rank: This process's index on its node; ``None`` reads ``LOCAL_RANK``
            (defaulting to 0 when the world size is 1). On hpu, ``LOCAL_RANK`` must
            already hold this value when the backend is created: Habana's bridge picks
            the card from it on import, and this is checked.
        **kwargs: Passed on unchanged (``device_id``, ``group_name``, ``pg_options``...).

    Returns:
        The accelerator, with this process's device now current: ``.device()`` is the
        device to put the model on.

    Raises:
        DistributedSetupError: ``torch.distributed`` is unavailable; the default
            process group already exists; ``RANK`` without ``WORLD_SIZE`` (or the
            reverse), a rank outside ``0..WORLD_SIZE-1``, a value that is not an
            integer, ``LOCAL_RANK`` or ``LOCAL_WORLD_SIZE`` beyond the visible devices or
            inconsistent with ``WORLD_SIZE``; ``MASTER_ADDR``/``MASTER_PORT`` unset for
            the ``env://`` rendezvous; ``backend`` is not a str, or names a
            communication backend ``torch.distributed`` does not know (other than
            ``accel_backend.communication_backend``, which preparation registers); on
            hpu with more than one process, a local rank other than the ``LOCAL_RANK``
            the backend was created with (see the module docstring).
        accel.BackendUnavailableError: ``accel_backend`` is ``None`` and no backend is
            usable (from :func:`accel.get_backend`).
    """
    if not dist.is_available():
        raise _error(
            "this torch build has no torch.distributed support (torch.distributed."
            "is_available() is False). Install a torch build with distributed support."
        )
    if dist.is_initialized():
        raise _error(
            "the default process group is already initialised (init_process_group was "
            "called before in this process). Call it once per process, or call "
            "torch.distributed.destroy_process_group() before initialising again."
        )
    resolved_rank, resolved_world_size = _rank_and_world_size(rank, world_size)
    resolved_local_rank, local_world_size = _local_layout(local_rank, resolved_world_size)
    _check_rendezvous(init_method, store)
    if accel_backend is None:
        from ._env import selected_name
        from ._select import get_backend, select_backend

        env_local_rank = os.environ.get("LOCAL_RANK", "").strip()
        if (
            resolved_world_size > 1
            and env_local_rank != str(resolved_local_rank)
            # ACCEL is read as a name: probing a named hpu would import the bridge.
            and (selected_name() or select_backend().name).strip().lower() == "hpu"
        ):
            # Refuse before creating it: creation imports the bridge, which binds a card.
            _raise_hpu_local_rank(env_local_rank or "unset", resolved_local_rank)
        accel_backend = get_backend()
    _check_hpu_local_rank(accel_backend, resolved_local_rank, resolved_world_size)
    index = _device_index(accel_backend, resolved_local_rank, local_world_size)
    _check_communication_backend(backend, accel_backend)
    accel_backend.prepare_distributed()
    accel_backend.set_device(index)
    dist.init_process_group(
        backend=accel_backend.communication_backend if backend is None else backend,
        init_method=init_method,
        timeout=timeout,
        world_size=resolved_world_size,
        rank=resolved_rank,
        store=store,
        **kwargs,
    )
    return accel_backend


def get_rank(group: dist.ProcessGroup | None = None) -> int:
    """Return this process's rank in ``group``, or 0 when no process group exists.

    Unlike :func:`torch.distributed.get_rank`, which raises before
    :func:`init_process_group`, this lets the same code run in one process and under
    torchrun (``if accel.distributed.get_rank() == 0: save(...)``).

    Args:
        group: The process group; ``None`` means the default group.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return 0
    return dist.get_rank(group)


def get_world_size(group: dist.ProcessGroup | None = None) -> int:
    """Return the number of processes in ``group``, or 1 when no process group exists.

    Unlike :func:`torch.distributed.get_world_size`, which raises before
    :func:`init_process_group`, this lets the same code run in one process and under
    torchrun (e.g. to scale a learning rate or split a data set).

    Args:
        group: The process group; ``None`` means the default group.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


def fully_shard(module: torch.nn.Module, **kwargs: Any) -> Any:
    """Shard ``module`` with FSDP2, on every supported torch release.

    The same as ``torch.distributed.fsdp.fully_shard`` (public since torch 2.6), which
    torch 2.4 and 2.5 ship as ``torch.distributed._composable.fsdp.fully_shard``; one
    import works on every release accel supports. Shard each (checkpointed) block, then
    the root, after :func:`init_process_group`.

    Args:
        module: The module to shard, in place.
        **kwargs: Passed on to torch's ``fully_shard`` (``mesh``, ``reshard_after_forward``,
            ``mp_policy``, ...).

    Returns:
        What torch's ``fully_shard`` returns: ``module``, now an FSDP module.

    Raises:
        DistributedSetupError: The mesh is on the CPU (``mesh`` with device type ``cpu``,
            or no mesh and a gloo process group) and torch is older than 2.7, whose FSDP2
            runs only on CUDA; nothing was changed.
    """
    mesh = kwargs.get("mesh")
    if mesh is not None:
        device_type = str(getattr(mesh, "device_type", "cpu"))
    else:
        device_type = "cpu" if dist.is_initialized() and dist.get_backend() == "gloo" else ""
    if device_type == "cpu" and torch_release() < FSDP2_MIN_RELEASE_OFF_CUDA:
        needed = ".".join(map(str, FSDP2_MIN_RELEASE_OFF_CUDA))
        raise _error(
            f"FSDP2 (fully_shard) on the CPU needs torch {needed} or newer, and this is torch "
            f"{torch.__version__}, whose FSDP2 runs only on CUDA devices. Upgrade torch, "
            "shard on CUDA devices, or use DistributedDataParallel on the CPU."
        )
    return fsdp2_fully_shard()(module, **kwargs)
