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

Some backends bind their device when they are created, from ``LOCAL_RANK``; their
:class:`accel.BackendSpec` says so (``binds_device_at_creation``). Gaudi (``hpu``) is
one: Habana's bridge chooses the card (``HLS_MODULE_ID``) from ``LOCAL_RANK`` when it
is imported, which is when the hpu backend is created (or earlier, at ``import torch``,
where the bridge autoloads), and it reports one device per process, so it always binds
index 0. ``LOCAL_RANK`` must therefore be in the environment before the first
``accel.get_backend()``; torchrun sets it at process start. accel records it when it
creates such a backend, and :func:`init_process_group` checks that it is this
process's local rank (before creating the backend, where it creates it).

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
from ._launch import (
    check_local_rank_at_creation,
    check_rendezvous,
    device_index,
    distributed_error,
    local_layout,
    raise_local_rank_at_creation,
    rank_and_world_size,
)
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
        raise distributed_error(
            f"backend={backend!r} is {_article(type(backend).__name__)}, not a str naming a "
            f"torch.distributed backend. {hint}"
        )
    known = [name for name in dist.Backend.backend_list if name != "undefined"]
    names = [part.split(":", 1)[-1].strip() for part in backend.lower().split(",")]
    unknown = [name for name in names if name not in known and name != own]
    if unknown or not names:
        raise distributed_error(
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
        raise distributed_error(
            "this torch build has no torch.distributed support (torch.distributed."
            "is_available() is False). Install a torch build with distributed support."
        )
    if dist.is_initialized():
        raise distributed_error(
            "the default process group is already initialised (init_process_group was "
            "called before in this process). Call it once per process, or call "
            "torch.distributed.destroy_process_group() before initialising again."
        )
    resolved_rank, resolved_world_size = rank_and_world_size(rank, world_size)
    resolved_local_rank, local_world_size = local_layout(local_rank, resolved_world_size)
    check_rendezvous(init_method, store)
    if accel_backend is None:
        from ._env import selected_name
        from ._select import binds_device_at_creation, get_backend, select_backend

        env_local_rank = os.environ.get("LOCAL_RANK", "").strip()
        if resolved_world_size > 1 and env_local_rank != str(resolved_local_rank):
            # ACCEL is read as a name: probing a named backend may import its vendor.
            name = (selected_name() or select_backend().name).strip().lower()
            if binds_device_at_creation(name):
                # Refuse before creating it: creation binds the device.
                raise_local_rank_at_creation(name, env_local_rank or "unset", resolved_local_rank)
        accel_backend = get_backend()
    check_local_rank_at_creation(accel_backend, resolved_local_rank, resolved_world_size)
    index = device_index(accel_backend, resolved_local_rank, local_world_size)
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
        raise distributed_error(
            f"FSDP2 (fully_shard) on the CPU needs torch {needed} or newer, and this is torch "
            f"{torch.__version__}, whose FSDP2 runs only on CUDA devices. Upgrade torch, "
            "shard on CUDA devices, or use DistributedDataParallel on the CPU."
        )
    return fsdp2_fully_shard()(module, **kwargs)
