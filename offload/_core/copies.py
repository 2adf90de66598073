"""Parameters that reach the device as differentiable copies, for devices that need it.

Offload normally keeps each parameter object and points its ``.data`` at a device copy
while it computes. torch allows that only between tensor types that can share a shallow
copy; a device whose tensors are of another type (a lazy-tensor runtime's) refuses it
with "incompatible tensor type". :func:`swaps_data` asks torch which case a device is.

Where it is refused, the parameters stay host tensors and reach the device through an
autograd Function whose forward copies the host tensors to the device and whose backward
hands their gradients to the host tensors. The layers compute with the copies
(substituted for the parameters, see :func:`substituted`), and autograd accumulates the
host gradients into the parameters' ``.grad`` as for any leaf: tied weights, gradient
accumulation and ``register_post_accumulate_grad_hook`` behave as without offload.
Buffers are copied in (no gradient) and written back after the forward that updated them
(:func:`write_back`). On a device that allocates eagerly the copies live in memory kept
from step to step (:mod:`offload._core.copier`); on a lazy device they are made by
:func:`load` (:class:`Load`'s backward sends the gradients home in one transfer per
dtype).

A copy a forward saves for its backward stays on the device until that backward; a
checkpointed forward saves none, and its recomputation copies the parameters again.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from .._errors import OffloadConfigError

__all__ = [
    "Load",
    "Slots",
    "load",
    "require_host",
    "slots_of",
    "substituted",
    "swaps_data",
    "unique",
    "write_back",
]

_HOST = torch.device("cpu")
_swaps: dict[torch.device, bool] = {}


def swaps_data(device: torch.device) -> bool:
    """Return whether a host tensor's ``.data`` can be pointed at a tensor on ``device``.

    Asked once per device (the probe allocates an empty tensor there).
    """
    if device not in _swaps:
        probe = torch.empty(0, device=device)
        _swaps[device] = bool(torch._has_compatible_shallow_copy_type(torch.empty(0), probe))
    return _swaps[device]


class Load(torch.autograd.Function):
    """Copy host tensors to a device; backward returns their gradients to the host.

    Inputs are the device and the host tensors; outputs are their device copies, in
    order. Backward moves the copies' gradients in one flat transfer per dtype.
    """

    @staticmethod
    def forward(ctx: Any, device: torch.device, *hosts: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.set_materialize_grads(False)
        return tuple(host.to(device, copy=True) for host in hosts)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        host: list[torch.Tensor | None] = [None] * len(grads)
        by_dtype: dict[torch.dtype, list[int]] = {}
        for position, grad in enumerate(grads):
            if grad is not None:
                by_dtype.setdefault(grad.dtype, []).append(position)
        for positions in by_dtype.values():
            parts = [grads[k] for k in positions]
            flat = torch.cat([part.reshape(-1) for part in parts if part is not None])
            pieces = torch.split(flat.to(_HOST), [p.numel() for p in parts if p is not None])
            for k, piece, part in zip(positions, pieces, parts, strict=True):
                assert part is not None
                host[k] = piece.view(part.shape)
        return (None, *host)


def load(device: torch.device, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Return device copies of ``tensors``, differentiable where that is needed.

    Through :class:`Load` where autograd records and a tensor requires grad; plain copies
    otherwise (buffers, frozen parameters).
    """
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        trainable = [t for t in tensors if t.requires_grad]
        copies = iter(Load.apply(device, *trainable))
        with torch.no_grad():
            return [next(copies) if t.requires_grad else t.to(device, copy=True) for t in tensors]
    with torch.no_grad():
        return [t.to(device, copy=True) for t in tensors]


Slots = list[tuple[nn.Module, str, bool, torch.Tensor]]
"""Where tensors sit in modules: ``(module, name, is_parameter, tensor)``."""


def slots_of(modules: Sequence[nn.Module], *, buffers: bool = True) -> Slots:
    """Every parameter (and buffer) slot of ``modules`` and their submodules, once each."""
    seen: set[tuple[int, str]] = set()
    slots: Slots = []
    for root in modules:
        for module in root.modules():
            tables: list[tuple[bool, dict[str, Any]]] = [(True, module._parameters)]
            if buffers:
                tables.append((False, module._buffers))
            for is_parameter, table in tables:
                for name, tensor in table.items():
                    if tensor is not None and (id(module), name) not in seen:
                        seen.add((id(module), name))
                        slots.append((module, name, is_parameter, tensor))
    return slots


def unique(slots: Slots) -> list[torch.Tensor]:
    """The distinct tensors of ``slots`` (a tied weight sits in several), in order."""
    tensors: dict[int, torch.Tensor] = {}
    for _, _, _, tensor in slots:
        tensors.setdefault(id(tensor), tensor)
    return list(tensors.values())


@contextmanager
def substituted(slots: Slots, copies: dict[int, torch.Tensor]) -> Iterator[None]:
    """Put ``copies[id(tensor)]`` in each slot while the block runs, then what was there.

    The module tables are written directly: a copy is not an ``nn.Parameter``, and
    ``nn.Module.__setattr__`` would refuse it in a parameter's place.
    """
    previous: list[tuple[dict[str, Any], str, Any]] = []
    try:
        for module, name, is_parameter, tensor in slots:
            table: dict[str, Any] = module._parameters if is_parameter else module._buffers
            previous.append((table, name, table[name]))
            table[name] = copies[id(tensor)]
        yield
    finally:
        for table, name, value in reversed(previous):
            table[name] = value


def write_back(slots: Slots, copies: dict[int, torch.Tensor]) -> None:
    """Copy the device buffers' values (a forward may update them) to their host tensors."""
    with torch.no_grad():
        for _, _, is_parameter, tensor in slots:
            if not is_parameter:
                tensor.copy_(copies[id(tensor)].to(tensor.device))


def require_host(model: nn.Module, device: torch.device) -> None:
    """Refuse tensors that are not in host memory, where they cannot be moved in place."""
    away = sorted(
        {str(t.device) for t in [*model.parameters(), *model.buffers()] if t.device.type != "cpu"}
    )
    if away:
        raise OffloadConfigError(
            f"offload: the model has parameters or buffers on {', '.join(away)}, but on "
            f"{device} offload keeps them in host memory and cannot move them there in place "
            f"(torch cannot point a {device.type} tensor's .data at host memory). Build or load "
            "the model on the host (or call model.cpu()) before wrapping it."
        )
