"""Keeping a checkpoint's inputs in host memory between forward and backward.

A checkpoint keeps only its inputs alive until backward; with ``offload_to_cpu`` those
inputs move to host memory as well. The copy to the host goes to page-locked memory
(``backend.empty_pinned``) on a side stream (``backend.Stream()``) where the backend
has them, so it overlaps with the checkpointed function's own work, and is ordered
with events:

* forward: the side stream waits for the current stream (the input must be complete),
  copies, and records an event; after the function ran, the current stream waits for
  that event before the device input is released, so the allocator cannot hand its
  memory to new work while the copy still reads it;
* backward: a device tensor is allocated on the current stream, the side stream waits
  for the current stream, copies back, and the current stream waits for the copy.

Tensors already in host memory are kept as they are: on a host backend offloading
copies nothing.

A stashed input bypasses ``save_for_backward``, and autograd checks no version counter
through saved-tensor hooks, so an in-place write to the input after the forward
(``x += attn(x)``) would go unnoticed on a device while the host path (which saves the
tensor itself) raises. Each :class:`HostCopy` therefore keeps a witness sharing the
input's version counter (no memory) and :func:`restore` raises autograd's error when
the version moved, whatever the device.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import torch

from accel import Accelerator

__all__ = [
    "HostCopy",
    "check_version",
    "restore",
    "side_stream",
    "stash",
    "version_witness",
    "wait_for_copies",
]


@dataclass
class HostCopy:
    """A device tensor's values, kept in host memory until backward.

    Attributes:
        host: The host tensor holding the values (pinned where supported).
        device: The device to restore to.
        requires_grad: The original tensor's ``requires_grad``.
        copied: An event that completes when ``host`` holds the values, or ``None``
            where the copy ran on the current stream.
        witness: An empty tensor sharing the original's version counter (see
            :func:`version_witness`), or ``None`` where no check is made.
        version: The original's version when it was stashed.
    """

    host: torch.Tensor
    device: torch.device
    requires_grad: bool
    copied: Any = None
    witness: torch.Tensor | None = None
    version: int = 0


def version_witness(tensor: torch.Tensor) -> torch.Tensor:
    """Return an empty tensor on ``tensor``'s device that shares its version counter.

    ``detach()`` shares the version counter (and the storage); swapping the detached
    tensor's ``.data`` for an empty one keeps the counter and drops the storage, so the
    witness follows every in-place write to ``tensor`` (or a view of its base) without
    keeping its memory alive.
    """
    witness = tensor.detach()
    # On the tensor's own device: torch refuses to swap in data of another tensor type
    # (on a lazy device, a tensor's .data cannot be swapped for a host tensor).
    witness.data = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
    return witness


def check_version(item: HostCopy) -> None:
    """Raise autograd's error if the stashed tensor was modified in place since."""
    if item.witness is None or item.witness._version == item.version:
        return
    shape = list(item.host.shape)
    raise RuntimeError(
        "checkpointing: one of the variables needed for gradient computation has been "
        "modified by an inplace operation: the checkpoint input offloaded to host memory "
        f"([{item.host.dtype} {shape}] from {item.device}) is at version "
        f"{item.witness._version}; expected version {item.version} instead. The "
        "recomputation would read the values from before the write while the rest of "
        "the graph sees them after it, so the gradients would be wrong. Write out of "
        "place after the checkpoint (x = x + f(x) instead of x += f(x)), or clone the "
        "input before writing to it."
    )


_streams_lock = threading.Lock()
_side_streams: dict[tuple[int, int], tuple[Accelerator, Any]] = {}


def side_stream(backend: Accelerator) -> Any:
    """Return this backend's copy stream for the current device, creating it once."""
    key = (id(backend), backend.current_device())
    with _streams_lock:
        entry = _side_streams.get(key)
        if entry is None or entry[0] is not backend:
            entry = (backend, backend.Stream())
            _side_streams[key] = entry
        return entry[1]


def _on_host(tensor: torch.Tensor) -> bool:
    return tensor.device.type == "cpu"


def stash(tensor: torch.Tensor, backend: Accelerator) -> torch.Tensor | HostCopy:
    """Start copying ``tensor`` to host memory; return it unchanged if it is there already.

    Args:
        tensor: A checkpoint input.
        backend: The backend whose streams, events and pinned memory to use.

    Returns:
        ``tensor`` itself for a host tensor, else a :class:`HostCopy` whose copy may
        still be in flight (see :func:`wait_for_copies`).
    """
    if _on_host(tensor):
        return tensor
    return copy_to_host(tensor, backend)


def copy_to_host(tensor: torch.Tensor, backend: Accelerator) -> HostCopy:
    """Copy ``tensor`` into new host memory, asynchronously where the backend allows."""
    pinned = backend.supports_pinned_memory
    # Allocated pinned (no pageable block to copy), with the layout empty_like would give.
    layout = torch.empty_like(tensor, device="meta")
    host = backend.empty_pinned((layout.numel(),), tensor.dtype).as_strided(
        layout.shape, layout.stride()
    )
    data = tensor.detach()
    witness, version = version_witness(tensor), tensor._version
    if not backend.supports_streams:
        host.copy_(data, non_blocking=pinned)
        return HostCopy(host, tensor.device, tensor.requires_grad, None, witness, version)
    current = backend.current_stream()
    side = side_stream(backend)
    side.wait_stream(current)
    with backend.stream(side):
        host.copy_(data, non_blocking=pinned)
    copied = side.record_event()
    return HostCopy(host, tensor.device, tensor.requires_grad, copied, witness, version)


def wait_for_copies(stashed: list[Any], backend: Accelerator) -> None:
    """Make the current stream wait until every copy to the host in ``stashed`` is done.

    Call it before the device inputs are released, so that their memory is not
    reused while a side-stream copy still reads it.
    """
    events = [item.copied for item in stashed if isinstance(item, HostCopy) and item.copied]
    if not events:
        return
    current = backend.current_stream()
    for event in events:
        current.wait_event(event)


def restore(item: torch.Tensor | HostCopy, backend: Accelerator) -> torch.Tensor:
    """Return a stashed input on its device (a new tensor for a :class:`HostCopy`).

    The returned tensor is ready for work queued on the current stream. Its
    ``requires_grad`` is the original's.

    Raises:
        RuntimeError: The original was modified in place after it was stashed (autograd's
            error for a modified saved tensor, prefixed ``checkpointing:``).
    """
    if not isinstance(item, HostCopy):
        return item
    check_version(item)
    pinned = backend.supports_pinned_memory
    restored = torch.empty_like(item.host, device=item.device)
    if backend.supports_streams:
        current = backend.current_stream()
        side = side_stream(backend)
        side.wait_stream(current)
        with backend.stream(side):
            restored.copy_(item.host, non_blocking=pinned)
        current.wait_event(side.record_event())
    else:
        restored.copy_(item.host, non_blocking=pinned)
    return restored.requires_grad_(item.requires_grad)
