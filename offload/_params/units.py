"""The units of :func:`offload.offload_parameters` and the copies that move them.

A *unit* is a submodule whose own parameters are packed into host memory, or a *group*:
parameters shared by several units (tied weights), packed on their own and loaded
whenever any module that uses them runs. :class:`Mover` loads a unit's parameters (and,
for backward, its host gradients) on the copy stream into device memory from a pool kept
across steps, points the parameters at the device copies, and back; gradients go to the
host as they are accumulated, into the tensor the user already holds when there is one
(as autograd accumulates in place), else into a new one, so a gradient handed out is
never rewritten by a later step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .._core.grads import Destination, Destinations, standalone
from .._core.pool import DevicePool
from .._core.storage import SliceStorage
from .._core.transfer import Transfers, dense_stride
from .._state import StateMachine

__all__ = ["Mover", "Order", "Unit", "output_tensors", "restored"]


@dataclass
class Order:
    """An execution order, learned the first time it runs, for prefetching."""

    units: list[int] = field(default_factory=list)
    position: dict[int, int] = field(default_factory=dict)
    learning: bool = True

    def see(self, index: int) -> None:
        if self.learning and index not in self.position:
            self.position[index] = len(self.units)
            self.units.append(index)

    def finish(self) -> None:
        if self.units:
            self.learning = False

    def after(self, index: int, count: int) -> list[int]:
        """The ``count`` units that ran after ``index`` (none while still learning)."""
        position = self.position.get(index)
        if self.learning or position is None:
            return []
        return self.units[position + 1 : position + 1 + count]


@dataclass
class Unit:
    """One module's offloaded parameters (or a group of shared ones), and where they are."""

    index: int
    module: nn.Module | None  # None for a group of shared parameters
    storage: SliceStorage
    machine: StateMachine
    groups: list[Unit] = field(default_factory=list)
    users: int = 0  # forward calls of modules using it that are running now
    cache_states: list[bool] = field(default_factory=list)
    flats: dict[torch.dtype, torch.Tensor] | None = None
    loaded: Any = None
    # For backward: each parameter's device gradient (None: not loaded for backward),
    # in gradient memory per dtype, and the host gradients held, loaded beside them.
    device_grads: dict[int, torch.Tensor] | None = None
    grad_flats: dict[torch.dtype, torch.Tensor] = field(default_factory=dict)
    held_flats: dict[torch.dtype, torch.Tensor] = field(default_factory=dict)
    held: dict[int, torch.Tensor] = field(default_factory=dict)
    stashed: dict[int, torch.Tensor | None] = field(default_factory=dict)
    attached: bool = False
    fired: set[int] = field(default_factory=set)
    stored: Any = None  # the event after the last gradient store into host memory
    resumes_backward: bool = False

    @property
    def trainable(self) -> set[int]:
        return {id(p) for p in self.storage.parameters if p.requires_grad}


class Mover:
    """Moves units between their host storage and the device.

    Device memory comes from a :class:`offload._core.pool.DevicePool` kept across steps:
    a unit's parameters load into one flat tensor per dtype, and for backward its
    gradients live in another, laid out the same way, preset as the parameters' ``.grad``
    (and open in :attr:`destinations`), so backward writes or accumulates in place.

    Args:
        units: Every unit, indexed by ``unit.index``.
        transfers: The copy stream.
        device: The compute device.
        prefetch: How many units may wait loaded but unused.
        copy: Whether anything moves (``False``: device and host are the same).
    """

    def __init__(
        self,
        units: Sequence[Unit],
        transfers: Transfers,
        device: torch.device,
        *,
        prefetch: int,
        copy: bool,
    ) -> None:
        self.units = list(units)
        self.transfers = transfers
        self.device = device
        self.prefetch_count = prefetch
        self.copy = copy
        self.prefetched: list[int] = []
        self.storage_owner: dict[int, tuple[int, torch.dtype]] = {}
        self.max_resident = 0
        self.pool = DevicePool(transfers, device)
        #: Where backward writes each parameter's gradient while its unit is attached.
        self.destinations = Destinations()

    def resident(self) -> list[Unit]:
        """The units whose parameters are in (or on their way to) device memory."""
        return [unit for unit in self.units if unit.flats is not None]

    def claim(self, unit: Unit, *, grads: bool) -> None:
        """Start loading ``unit`` (unless prefetched) for use now: no longer a prefetch."""
        if unit.index in self.prefetched:
            self.prefetched.remove(unit.index)
        self.issue(unit, grads=grads)

    def prefetch(self, indices: Sequence[int], *, grads: bool) -> None:
        """Start loading the units ``indices``; at most ``prefetch`` wait unused at once."""
        for index in indices:
            unit = self.units[index]
            if unit.attached:
                continue
            if index in self.prefetched:
                self.prefetched.remove(index)
            while len(self.prefetched) >= max(self.prefetch_count, 1):
                stale = self.units[self.prefetched.pop(0)]
                if not stale.attached:
                    self.drop(stale)
            self.issue(unit, grads=grads)
            self.prefetched.append(index)

    def issue(self, unit: Unit, *, grads: bool) -> None:
        """Start copying ``unit``'s parameters (and host gradients) to the device."""
        transfers = self.transfers
        if unit.flats is None:
            unit.flats = {}
            if self.copy:
                with transfers.on_copy_stream() as compute:
                    for dtype, flat in unit.storage.flats.items():
                        assert flat.host is not None
                        device = self.pool.take(dtype, flat.host.numel())
                        transfers.used_by(device, compute)
                        device.copy_(flat.host, non_blocking=transfers.non_blocking)
                        unit.flats[dtype] = device
                unit.loaded = transfers.copy_event()
            self.max_resident = max(self.max_resident, len(self.resident()))
        if grads and unit.device_grads is None:
            unit.device_grads, unit.grad_flats, unit.held_flats, unit.held = {}, {}, {}, {}
            if self.copy:
                transfers.copy_waits(unit.stored)  # host gradients written on the store stream
                with transfers.on_copy_stream() as compute:
                    self._load_grads(unit, compute)
                unit.loaded = transfers.copy_event()

    def _load_grads(self, unit: Unit, compute: Any) -> None:
        """Zero ``unit``'s gradient memory; load the host gradients held into memory beside it.

        Backward then writes each parameter's gradient from zero, summing its uses in the
        order autograd would, and :meth:`add_held` adds the held one once it is complete:
        the plain model's ``held + sum of uses``, bit for bit.
        """
        assert unit.device_grads is not None
        for dtype, flat in unit.storage.flats.items():
            trainable = [e for e in flat.entries if e.is_parameter and e.tensor.requires_grad]
            if not trainable:
                continue
            assert flat.host is not None
            memory = self.pool.take(dtype, flat.host.numel())
            self.transfers.used_by(memory, compute)
            memory.zero_()
            unit.grad_flats[dtype] = memory
            held: torch.Tensor | None = None
            for entry in trainable:
                key = id(entry.tensor)
                unit.device_grads[key] = standalone(entry.view(memory))
                host = unit.stashed.get(key) if unit.attached else entry.tensor.grad
                if host is None:
                    continue
                if held is None:
                    held = self.pool.take(dtype, flat.host.numel())
                    self.transfers.used_by(held, compute)
                    unit.held_flats[dtype] = held
                unit.held[key] = entry.view(held)
                unit.held[key].copy_(host, non_blocking=self.transfers.non_blocking)

    def attach(self, unit: Unit) -> None:
        """Point ``unit``'s parameters at their device copies (after the copy finished)."""
        unit.attached = True
        if unit.index in self.prefetched:
            self.prefetched.remove(unit.index)
        if not self.copy:
            return
        assert unit.flats is not None
        self.transfers.compute_waits(unit.loaded)
        for parameter in unit.storage.parameters:
            unit.stashed[id(parameter)] = parameter.grad
            parameter.grad = None
        for dtype, flat in unit.storage.flats.items():
            device = unit.flats[dtype]
            self.storage_owner[device.untyped_storage().data_ptr()] = (unit.index, dtype)
            for entry in flat.entries:
                entry.tensor.data = entry.view(device)
        self._open(unit)

    def _open(self, unit: Unit) -> None:
        """Preset the device gradients as ``.grad`` and open them as destinations."""
        for parameter in unit.storage.parameters:
            grad = (unit.device_grads or {}).get(id(parameter))
            if grad is not None:
                parameter.grad = grad
                self.destinations.open(id(parameter), Destination.empty(grad))

    def add_held(self, unit: Unit, parameter: torch.Tensor) -> None:
        """Add the host gradient held for ``parameter`` (loaded beside it) into its gradient."""
        held = unit.held.pop(id(parameter), None)
        if held is not None and parameter.grad is not None:
            with torch.no_grad():
                parameter.grad.add_(held)

    def grad_to_host(self, unit: Unit, parameter: torch.Tensor) -> None:
        """Copy ``parameter``'s accumulated device gradient to its host gradient.

        The host gradient the user holds (set aside by :meth:`attach`) receives it in
        place; without one, a new host tensor does, so a gradient handed out earlier and
        dropped with ``zero_grad(set_to_none=True)`` is never written again.
        """
        if not self.copy or parameter.grad is None:
            return
        host = unit.stashed.get(id(parameter))
        if host is None:
            host = self.transfers.empty_host(
                parameter.shape, parameter.grad.dtype, dense_stride(parameter)
            )
        self.transfers.copy_waits_for_compute(store=True)
        with self.transfers.on_copy_stream(store=True):
            host.copy_(parameter.grad, non_blocking=self.transfers.non_blocking)
            self.transfers.used_by(parameter.grad, self.transfers.store_stream)
        unit.stored = self.transfers.copy_event(store=True)
        unit.stashed[id(parameter)] = host

    def detach(self, unit: Unit) -> None:
        """Point ``unit``'s parameters back at host memory, with their host gradients."""
        if not unit.attached:
            return
        unit.attached = False
        if not self.copy:
            return
        for parameter in unit.storage.parameters:
            self.destinations.close(id(parameter))
            parameter.grad = None
        for entry in unit.storage.entries():
            entry.tensor.data = entry.home
        for parameter in unit.storage.parameters:
            parameter.grad = unit.stashed.pop(id(parameter), None)

    def drop(self, unit: Unit) -> None:
        """Release ``unit``'s device memory to the pool (it must be detached)."""
        if unit.attached:
            return
        if unit.index in self.prefetched:
            self.prefetched.remove(unit.index)
        if unit.flats:
            done = self.transfers.compute_event() if self.copy else None
            for device in unit.flats.values():
                self.storage_owner.pop(device.untyped_storage().data_ptr(), None)
                self.pool.release(device, [done])
            for memory in [*unit.grad_flats.values(), *unit.held_flats.values()]:
                self.pool.release(memory, [done, unit.stored])
        unit.flats = None
        unit.device_grads = None
        unit.grad_flats, unit.held_flats, unit.held = {}, {}, {}
        unit.loaded = None


def restored(tensor: torch.Tensor, device: torch.device, stride: tuple[int, ...]) -> torch.Tensor:
    """Return a copy of ``tensor`` on ``device`` with ``stride``."""
    fresh = torch.empty_strided(tensor.shape, stride, dtype=tensor.dtype, device=device)
    fresh.copy_(tensor)
    return fresh


def output_tensors(value: Any, depth: int = 0) -> list[torch.Tensor]:
    """Return the tensors in a module's output (also inside lists, tuples and dicts)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if depth > 4:
        return []
    if isinstance(value, dict):
        return [t for item in value.values() for t in output_tensors(item, depth + 1)]
    if isinstance(value, list | tuple):
        return [t for item in value for t in output_tensors(item, depth + 1)]
    return []
