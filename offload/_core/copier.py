"""Device copies of host tensors in memory that is kept and reused, gradients written into it.

The ``"copy-parameters"`` strategy computes with device copies of the host parameters,
made by an autograd Function whose backward hands their gradients to the host parameters
(autograd then adds each into ``.grad``, or keeps it there). :class:`Copier` makes the
copies of one wrapper:

* On a device that allocates eagerly, each load is a :class:`Group`: the tensors are laid
  out as packed host storage would be, one flat per dtype taken from a
  :class:`offload._core.pool.DevicePool` kept across steps. The layers write the
  weights' gradients into a second flat of the same layout (:mod:`offload._core.grads`),
  and :class:`LoadInto`'s backward copies each gradient from there to a new page-locked
  host tensor. After the first steps no device tensor as large as a parameter is
  allocated, in forward, in a recomputation or in backward.
* On a lazy device (``backend.is_lazy``: the runtime plans the memory of each graph, so
  there is nothing to keep) copies are made with ``.to()`` and backward sends each
  dtype's gradients home in one transfer (:class:`offload._core.copies.Load`).

A group forgets its copies once they are handed out, so that its memory returns to the
pool as soon as the layers and autograd are done with them: the copies a checkpointed
forward made are gone when forward ends (its recomputation loads again), while the
copies a plain forward saved for backward keep their memory until then.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import torch

from accel import Accelerator

from .copies import load
from .grads import Destination, GradientSink, Target, standalone
from .intercept import Interception
from .pool import DevicePool
from .storage import FlatLayout, lay_out
from .transfer import Transfers, dense_stride

__all__ = ["Copier", "Group", "LoadInto"]


class Group:
    """One load of host tensors: their copies in pooled memory, and their gradients' memory.

    Args:
        copier: The wrapper's copier.
        hosts: The host tensors, in order.
        layout: Where each of them goes in the flat of its dtype.
        ahead: Copy on the load stream (a prefetch; :meth:`ready` orders it before
            compute), not on the current stream.
    """

    def __init__(
        self,
        copier: Copier,
        hosts: Sequence[torch.Tensor],
        layout: dict[torch.dtype, FlatLayout],
        *,
        ahead: bool,
    ) -> None:
        self.copier = copier
        self.hosts = list(hosts)
        self.layout = layout
        self._where = {
            id(entry.tensor): (dtype, entry)
            for dtype, flat in layout.items()
            for entry in flat.entries
        }
        self._grads: dict[torch.dtype, torch.Tensor] = {}
        self._destinations: dict[int, Destination] = {}
        self._copied: Any = None
        transfers, pool = copier.transfers, copier.pool
        copies: dict[int, torch.Tensor] = {}
        with torch.no_grad(), transfers.on_copy_stream() if ahead else nullcontext():
            for dtype, flat in layout.items():
                memory = pool.take(dtype, flat.numel, stream="load" if ahead else "compute")
                for entry in flat.entries:
                    copy = standalone(entry.view(memory))
                    copy.copy_(entry.tensor, non_blocking=transfers.non_blocking)
                    copies[id(entry.tensor)] = copy
        if ahead:
            self._copied = transfers.copy_event()
        self.copies: list[torch.Tensor] = [copies[id(host)] for host in self.hosts]

    def ready(self) -> None:
        """Order the copies (made ahead, on the load stream) before the compute stream's work."""
        if self._copied is not None:
            transfers = self.copier.transfers
            transfers.compute_waits(self._copied)
            compute = transfers.backend.current_stream()
            for copy in self.copies:
                transfers.used_by(copy, compute)
            self._copied = None

    def target(self, host: torch.Tensor) -> Target:
        """Where the gradient of ``host``'s copy goes: its place in the gradient memory."""
        return _GroupTarget(self, id(host))

    def destination(self, key: int) -> Destination:
        """The gradient memory of host tensor ``key``, empty at first (taken on first use)."""
        destination = self._destinations.get(key)
        if destination is None:
            dtype, entry = self._where[key]
            memory = self._grads.get(dtype)
            if memory is None:
                memory = self.copier.pool.take(dtype, self.layout[dtype].numel, stream="compute")
                self._grads[dtype] = memory
            destination = Destination.empty(standalone(entry.view(memory)))
            self._destinations[key] = destination
        return destination

    def backward(
        self, hosts: Sequence[torch.Tensor], grads: Sequence[torch.Tensor | None]
    ) -> list[torch.Tensor | None]:
        """Each host tensor's gradient, in new host memory: what was written, plus ``grads``.

        ``grads`` are the gradients autograd brings to the copies (from layers that did
        not write theirs in place); the memory goes back to the pool afterwards.
        """
        totals: list[torch.Tensor | None] = []
        for host, grad in zip(hosts, grads, strict=True):
            destination = self._destinations.get(id(host))
            if destination is not None and destination.is_empty:
                destination = None
            if destination is not None and grad is not None:
                destination.tensor.add_(grad)
            totals.append(destination.tensor if destination is not None else grad)
        transfers = self.copier.transfers
        result: list[torch.Tensor | None] = []
        for host, total in zip(hosts, totals, strict=True):
            if total is None:
                result.append(None)
                continue
            # New host memory: autograd keeps it as .grad (never written again) or adds it.
            home = transfers.empty_host(host.shape, total.dtype, dense_stride(host))
            home.copy_(total)
            result.append(home)
        self._destinations.clear()
        self._grads.clear()
        return result


class _GroupTarget:
    def __init__(self, group: Group, key: int) -> None:
        self.group = group
        self.key = key

    def destination(self) -> Destination | None:
        return self.group.destination(self.key)


class LoadInto(torch.autograd.Function):
    """The copies of a :class:`Group`'s trainable tensors; backward sends their gradients home."""

    @staticmethod
    def forward(
        ctx: Any, group: Group, copies: list[torch.Tensor], *hosts: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        ctx.set_materialize_grads(False)
        ctx.group = group
        ctx.hosts = hosts
        return tuple(copies)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        group: Group = ctx.group
        return (None, None, *group.backward(ctx.hosts, grads))


class Copier:
    """Makes one wrapper's device copies (see the module docstring).

    Args:
        backend: The backend.
        device: The compute device.
        transfers: The wrapper's copy streams.
    """

    def __init__(self, backend: Accelerator, device: torch.device, transfers: Transfers) -> None:
        self.device = device
        self.transfers = transfers
        self.lazy = bool(backend.is_lazy)
        self.pool = DevicePool(transfers, device)
        self.sink = GradientSink()
        self.interception = Interception(self.sink)
        self._layouts: dict[tuple[int, ...], tuple[list[torch.Tensor], dict[Any, FlatLayout]]] = {}

    def reserve(self, tensors: Sequence[torch.Tensor]) -> None:
        """Size the gradients' scratch memory for ``tensors`` (the wrapper's parameters)."""
        self.sink.reserve(tensors)

    def ahead(self, hosts: Sequence[torch.Tensor]) -> Group | None:
        """Start copying ``hosts`` on the load stream, for :meth:`load` (``None``: lazy)."""
        return None if self.lazy else Group(self, hosts, self._layout(hosts), ahead=True)

    def load(self, hosts: Sequence[torch.Tensor], ready: Group | None = None) -> list[torch.Tensor]:
        """Device copies of ``hosts``, differentiable where autograd records and one requires it.

        ``ready`` is a group started by :meth:`ahead` for the same tensors.
        """
        if self.lazy:
            return load(self.device, hosts)
        group = ready if ready is not None else Group(self, hosts, self._layout(hosts), ahead=False)
        group.ready()
        copies = group.copies
        group.copies = []
        if not (torch.is_grad_enabled() and any(h.requires_grad for h in hosts)):
            return copies
        trainable = [k for k, host in enumerate(hosts) if host.requires_grad]
        made = iter(
            LoadInto.apply(group, [copies[k] for k in trainable], *[hosts[k] for k in trainable])
        )
        result = [
            next(made) if host.requires_grad else copy
            for host, copy in zip(hosts, copies, strict=True)
        ]
        for host, copy in zip(hosts, result, strict=True):
            if host.requires_grad:
                self.sink.track(copy, group.target(host))
        return result

    def _layout(self, hosts: Sequence[torch.Tensor]) -> dict[Any, FlatLayout]:
        key = tuple(id(host) for host in hosts)
        known = self._layouts.get(key)
        if known is None:
            known = (list(hosts), lay_out(hosts))  # the list keeps the ids valid
            self._layouts[key] = known
        return known[1]
