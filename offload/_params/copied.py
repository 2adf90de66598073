"""``offload_parameters`` where parameters reach the device as copies (:mod:`offload._core.copies`).

A module's forward pre-hook loads its parameters (device copies through
:class:`offload._core.copies.Load`) and puts the copies in their places; its forward
post-hook, which runs even when forward raises, puts back what was there. Nested units
(a module and its children) therefore see their own copies and hand the outer ones
back. Parameters of no chosen module are loaded by the root's hooks, for the whole
forward. Buffers move to the device once and come home on :meth:`remove`.

The gradients return to the host parameters through autograd, as each unit's backward
reaches its copies. A reentrant or non-reentrant checkpoint reruns the hooks when it
recomputes, so a checkpointed module copies its parameters again in backward instead
of keeping them on the device.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import torch
from torch import nn

from accel import Accelerator

from .._core.copier import Copier
from .._core.copies import Slots, slots_of, substituted, unique
from .._core.transfer import Transfers
from .._errors import OffloadStateError
from .._state import State
from .hooks import strong_hook, weak_hook

__all__ = ["CopyParameters"]


class _CopiedUnit:
    """One chosen module: its parameter slots and the substitutions now in force."""

    def __init__(self, index: int, name: str, module: nn.Module | None, slots: Slots) -> None:
        self.index = index
        self.name = name
        self.module = module
        self.slots = slots
        self.hosts = unique(slots)
        self.active: list[ExitStack] = []


class CopyParameters:
    """Offloads by loading parameters as differentiable device copies.

    The strategy behind :class:`offload.ParameterOffload` on a device whose tensors
    cannot stand in for host ones; the handle forwards its public surface here.
    ``prefetch`` is kept for the record: a copy is issued when its module runs.

    Args:
        module: The model.
        chosen: Each unit's label, module and parameters.
        prefetch: Kept for the record.
        backend: The backend.
        device: The compute device.
        keep: What the root's forward pre-hook holds (the handle).
    """

    def __init__(
        self,
        module: nn.Module,
        chosen: list[tuple[str, nn.Module, list[nn.Parameter]]],
        *,
        prefetch: int,
        backend: Accelerator,
        device: torch.device,
        keep: object,
    ) -> None:
        self.module = module
        self.backend = backend
        self.device = device
        self.prefetch = prefetch
        self._copier = Copier(backend, device, Transfers(backend))
        self._copier.reserve([p for _, _, params in chosen for p in params])
        self._removed = False
        self._depth = 0
        self._peak = 0
        self._order: list[int] = []
        self._backward: list[int] = []
        self._order_done = False
        self._units: list[_CopiedUnit] = []
        covered: set[int] = set()
        for index, (name, unit_module, params) in enumerate(chosen):
            wanted = {id(p) for p in params}
            slots = [s for s in slots_of([unit_module], buffers=False) if id(s[3]) in wanted]
            self._units.append(_CopiedUnit(index, name, unit_module, slots))
            covered |= wanted
        rest = [s for s in slots_of([module], buffers=False) if id(s[3]) not in covered]
        self._rest = _CopiedUnit(len(chosen), "parameters of no chosen module", None, rest)
        self._buffers: list[tuple[dict[str, Any], str, torch.Tensor]] = [
            (owner._buffers, name, buffer)
            for owner in module.modules()
            for name, buffer in owner._buffers.items()
            if buffer is not None
        ]
        with torch.no_grad():
            for table, name, tensor in self._buffers:
                table[name] = tensor.to(device)
        self._handles = [
            module.register_forward_pre_hook(strong_hook(self, keep), prepend=True),
            module.register_forward_hook(weak_hook(self, "_root_post_forward"), always_call=True),
        ]
        for unit in self._units:
            assert unit.module is not None
            self._handles.append(
                unit.module.register_forward_pre_hook(weak_hook(self, "_pre", unit))
            )
            self._handles.append(
                unit.module.register_forward_hook(weak_hook(self, "_post", unit), always_call=True)
            )

    # Read-only views -------------------------------------------------------------------

    @property
    def state(self) -> State:
        """``FORWARD`` while a unit's copies are in place, else ``IDLE``."""
        return State.FORWARD if any(u.active for u in self._units) else State.IDLE

    @property
    def states(self) -> dict[str, State]:
        """Each unit's state, by the unit's name."""
        return {u.name: State.FORWARD if u.active else State.IDLE for u in self._units}

    @property
    def resident_modules(self) -> tuple[str, ...]:
        """Names of the units whose parameter copies are in place now."""
        return tuple(u.name for u in self._units if u.active)

    @property
    def max_resident(self) -> int:
        """The most units that had their copies in place at once."""
        return self._peak

    @property
    def execution_order(self) -> tuple[str, ...]:
        """The units in the order the first forward ran them."""
        return tuple(self._units[k].name for k in self._order)

    @property
    def backward_order(self) -> tuple[str, ...]:
        """The units in the order the first backward reached their copies."""
        return tuple(self._units[k].name for k in self._backward)

    def is_home(self) -> bool:
        """Whether every parameter is home: host memory, host gradient, no copy in place."""
        units = [*self._units, self._rest]
        return not any(u.active for u in units) and all(
            p.device.type == "cpu" and (p.grad is None or p.grad.device.type == "cpu")
            for u in units
            for p in u.hosts
        )

    # Hooks ----------------------------------------------------------------------------

    def _load(self, unit: _CopiedUnit) -> None:
        copies = self._copier.load(unit.hosts)
        if not self._order_done and unit.module is not None and torch.is_grad_enabled():
            first = next((c for c in copies if c.requires_grad), None)
            if first is not None:
                first.register_hook(weak_hook(self, "_reached", unit.index, drop_args=True))
        stack = ExitStack()
        stack.enter_context(
            substituted(unit.slots, dict(zip(map(id, unit.hosts), copies, strict=True)))
        )
        stack.enter_context(self._copier.interception.active())
        unit.active.append(stack)

    def _unload(self, unit: _CopiedUnit) -> None:
        if unit.active:
            unit.active.pop().close()

    def _root_pre_forward(self, module: nn.Module, args: Any) -> None:
        if self._depth == 0:
            self.recover()
        self._depth += 1
        if self._depth == 1:
            self._load(self._rest)

    def _root_post_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._unload(self._rest)
            if self._order:
                self._order_done = True

    def _pre(self, module: nn.Module, args: Any, unit: _CopiedUnit) -> None:
        if not self._order_done and unit.index not in self._order:
            self._order.append(unit.index)
        self._load(unit)
        self._peak = max(self._peak, sum(1 for u in self._units if u.active))

    def _post(self, module: nn.Module, args: Any, output: Any, unit: _CopiedUnit) -> None:
        self._unload(unit)

    def _reached(self, index: int) -> None:
        if index not in self._backward:
            self._backward.append(index)

    # Recovery and removal -------------------------------------------------------------

    def recover(self) -> None:
        """Put every parameter back in its place (after a forward that did not finish)."""
        for unit in [*self._units, self._rest]:
            while unit.active:
                self._unload(unit)
        self._copier.interception.reset()
        self._depth = 0

    def remove(self) -> None:
        """Undo :func:`offload_parameters`: hooks removed, buffers back in host memory.

        Raises:
            offload.OffloadStateError: A forward is still running.
        """
        if self._removed:
            return
        if self._depth:
            raise OffloadStateError(
                f"offload: cannot remove the parameter offload while the model is in "
                f"{State.FORWARD.name}; call remove() between steps (or recover() first)."
            )
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._copier.pool.clear()
        with torch.no_grad():
            for table, name, home in self._buffers:
                home.copy_(table[name].to(home.device))
                table[name] = home
        self._removed = True
