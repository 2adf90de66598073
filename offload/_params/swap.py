"""The ``.data``-swapping strategy of :func:`offload.offload_parameters`: hooks and units.

For a device whose tensors can take a host tensor's place (CUDA, Gaudi, the host): each
parameter's ``.data`` is pointed at its device copy while its module runs.

* the root's forward pre-hook starts a step (bringing back anything a failed step left
  behind) and enters :class:`offload._params.saved.SavedTensors`, so that dropping a unit
  really frees its device memory while the user's own saved-tensor hooks keep working;
* a module's forward pre-hook loads its unit and the groups of shared parameters it
  uses (unless prefetched), prefetches the next ``prefetch`` units in execution order,
  learned on the first forward, and turns the autocast cache off while the module runs
  (a cached low-precision cast would keep a copy of every weight on the device); its
  forward post-hook (which runs even when forward raises) drops them and registers a
  pre-backward hook on each output tensor, once per tensor and unit;
* the pre-backward hook loads the parameters and the host gradients again (and
  prefetches the units before it); each parameter's post-accumulate-grad hook copies
  its gradient to the host as soon as it is accumulated; once every parameter of the
  unit has its gradient the unit is dropped;
* one final callback, queued from the outermost backward through the root's outputs,
  waits for the copies and returns every unit to ``IDLE``.

Reentrant checkpoints rerun forward hooks during backward and run nested backward passes
whose callbacks fire early; the hooks are idempotent and the final callback hangs off
the root's outputs, so both are handled. The root's forward pre-hook holds the handle,
and, through it, the handle, so offloading stays in force as long as the model lives,
until :meth:`SwapData.remove`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from accel import Accelerator
from checkpointing import is_recomputing

from .._core.grads import GradientSink
from .._core.intercept import Interception
from .._core.transfer import Transfers
from .._errors import OffloadStateError
from .._state import State
from .hooks import strong_hook, weak_hook
from .saved import Alias, SavedTensors
from .units import Mover, Order, Unit, output_tensors, restored

__all__ = ["SwapData"]


class SwapData:
    """Offloads by swapping each parameter's ``.data`` between host and device memory.

    The strategy behind :class:`offload.ParameterOffload` on devices that allow it (see
    :func:`offload._core.copies.swaps_data`); the handle forwards its public surface here.

    Args:
        module: The model.
        units: Its units, indexed by ``unit.index``.
        prefetch: How many units to load ahead.
        backend: The backend.
        device: The compute device.
        transfers: The copy streams.
        copy: Whether anything moves (``False``: the device is the host).
        origins: Every parameter and buffer with its original device and strides.
        keep: What the root's forward pre-hook holds (the handle), so that offloading
            stays in force while the model lives.
    """

    def __init__(
        self,
        module: nn.Module,
        units: list[Unit],
        *,
        prefetch: int,
        backend: Accelerator,
        device: torch.device,
        transfers: Transfers,
        copy: bool,
        origins: list[tuple[torch.Tensor, torch.device, tuple[int, ...]]],
        keep: object,
    ) -> None:
        self.module = module
        self.backend = backend
        self.device = device
        self.prefetch = prefetch
        self._copy = copy
        self._units = units
        self._origins = origins
        self._owner = {id(p): unit for unit in units for p in unit.storage.parameters}
        self._mover = Mover(units, transfers, device, prefetch=prefetch, copy=copy)
        self._interception: Interception | None = None
        if copy:  # gradients go straight into the units' gradient memory (see Mover)
            parameters = [p for unit in units for p in unit.storage.parameters]
            sink = GradientSink.of_parameters(parameters, self._mover.destinations)
            self._interception = Interception(sink)
        self._saved = SavedTensors(device, self._mover.storage_owner, self._alias_view)
        self._forward_order = Order()
        self._backward_order = Order()
        self._depth = 0
        self._callback_queued = False
        self._removed = False
        self._handles: list[RemovableHandle] = []
        self._install_hooks(keep)

    @property
    def transfers(self) -> Transfers:
        """The copy streams."""
        return self._mover.transfers

    # Read-only views -------------------------------------------------------------------

    @property
    def state(self) -> State:
        """``IDLE`` when every unit is idle, else the state of the first unit that is not."""
        for unit in self._units:
            if unit.machine.state is not State.IDLE:
                return unit.machine.state
        return State.IDLE

    @property
    def states(self) -> dict[str, State]:
        """Each unit's state, by the unit's name."""
        return {unit.storage.name: unit.machine.state for unit in self._units}

    @property
    def resident_modules(self) -> tuple[str, ...]:
        """Names of the units whose parameters are in device memory now."""
        return tuple(unit.storage.name for unit in self._mover.resident())

    @property
    def max_resident(self) -> int:
        """The most units that were in device memory at once."""
        return self._mover.max_resident

    @property
    def execution_order(self) -> tuple[str, ...]:
        """The units in the order the first forward ran them (used for prefetching)."""
        return tuple(self._units[index].storage.name for index in self._forward_order.units)

    @property
    def backward_order(self) -> tuple[str, ...]:
        """The units in the order the first backward reached them (used for prefetching)."""
        return tuple(self._units[index].storage.name for index in self._backward_order.units)

    def is_home(self) -> bool:
        """Whether every offloaded parameter is in its host memory, with host gradients."""
        return all(
            not unit.attached
            and unit.storage.is_home()
            and all(p.grad is None or p.grad.device.type == "cpu" for p in unit.storage.parameters)
            for unit in self._units
        )

    # Hooks ----------------------------------------------------------------------------

    def _install_hooks(self, keep: object) -> None:
        # The root's pre-hook holds the handle (a cycle the garbage collector sees), so a
        # handle nobody keeps stays in force. Tensor hooks live in C++, where a cycle back
        # to the model could never be collected: they hold the handle weakly.
        root = self.module
        self._handles.append(root.register_forward_pre_hook(strong_hook(self, keep), prepend=True))
        self._handles.append(
            root.register_forward_hook(weak_hook(self, "_root_post_forward"), always_call=True)
        )
        for unit in self._units:
            if unit.module is None:
                continue
            self._handles.append(
                unit.module.register_forward_pre_hook(weak_hook(self, "_pre_forward", unit))
            )
            self._handles.append(
                unit.module.register_forward_hook(
                    weak_hook(self, "_post_forward", unit), always_call=True
                )
            )
        for unit in self._units:
            for parameter in unit.storage.parameters:
                if parameter.requires_grad:
                    self._handles.append(
                        parameter.register_post_accumulate_grad_hook(
                            weak_hook(self, "_post_accumulate")
                        )
                    )

    def _root_pre_forward(self, module: nn.Module, args: Any) -> None:
        if self._depth == 0 and not is_recomputing():
            if self.state is not State.IDLE:
                self.recover()
            for unit in self._units:
                if not unit.attached:
                    self._mover.drop(unit)
        if self._depth == 0 and self._copy and torch.is_grad_enabled():
            self._saved.enter()
        self._depth += 1

    def _root_post_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        self._depth -= 1
        if self._depth > 0:
            return
        self._saved.exit()
        self._forward_order.finish()
        for unit in self._units:
            if not unit.attached:
                self._mover.drop(unit)
        if output is not None and torch.is_grad_enabled():
            for tensor in output_tensors(output):
                if tensor.requires_grad:
                    tensor.register_hook(weak_hook(self, "_root_pre_backward"))

    def _pre_forward(self, module: nn.Module, args: Any, unit: Unit) -> None:
        if self._copy:
            unit.cache_states.append(torch.is_autocast_cache_enabled())
            torch.set_autocast_cache_enabled(False)
        if self._interception is not None:
            self._interception.enter()
        for used in (unit, *unit.groups):
            self._use(used)

    def _use(self, unit: Unit) -> None:
        if unit.users == 0:
            recomputing = is_recomputing()
            previous = unit.machine.enter(
                State.FORWARD, recomputing=recomputing, why="its forward started"
            )
            unit.resumes_backward = previous is State.BACKWARD_PRE
            if not recomputing:
                self._forward_order.see(unit.index)
            if not unit.attached:
                self._mover.claim(unit, grads=False)
                if not recomputing:  # the forward order says nothing about a recomputation
                    self._mover.prefetch(
                        self._forward_order.after(unit.index, self.prefetch), grads=False
                    )
                self._mover.attach(unit)
        unit.users += 1

    def _post_forward(self, module: nn.Module, args: Any, output: Any, unit: Unit) -> None:
        if unit.cache_states:
            torch.set_autocast_cache_enabled(unit.cache_states.pop())
        if self._interception is not None:
            self._interception.exit()
        for used in (*reversed(unit.groups), unit):
            self._release(used, output)

    def _release(self, unit: Unit, output: Any) -> None:
        if unit.users == 0:
            return  # the pre-hook failed (a state error); nothing was loaded for this call
        unit.users -= 1
        if unit.users == 0:
            if unit.resumes_backward:
                unit.machine.enter(
                    State.BACKWARD_PRE, recomputing=True, why="recomputed forward ended"
                )
            else:
                unit.machine.enter(State.IDLE, why="its forward ended")
                self._mover.detach(unit)
                self._mover.drop(unit)
        if output is not None and torch.is_grad_enabled():
            hook = weak_hook(self, "_pre_backward", unit, drop_args=True)
            for tensor in output_tensors(output):
                if tensor.requires_grad:
                    registered = tensor.__dict__.setdefault("_offload_pre_backward", set())
                    if (id(self), unit.index) not in registered:
                        registered.add((id(self), unit.index))
                        tensor.register_hook(hook)

    def _root_pre_backward(self, grad: torch.Tensor) -> None:
        self._queue_final_callback()

    def _queue_final_callback(self) -> None:
        if not self._callback_queued:
            self._callback_queued = True
            engine = torch.autograd.Variable._execution_engine
            engine.queue_callback(self._final_callback)

    def _pre_backward(self, unit: Unit) -> None:
        # Normally queued by the root's outputs already; this covers a backward that
        # reaches a unit without passing through them.
        self._queue_final_callback()
        previous = unit.machine.enter(State.BACKWARD_PRE, why="backward reached its outputs")
        if previous is not State.BACKWARD_PRE:
            unit.fired.clear()
        self._backward_order.see(unit.index)
        if not unit.attached:
            self._mover.claim(unit, grads=True)
            self._mover.prefetch(self._backward_order.after(unit.index, self.prefetch), grads=True)
            self._mover.attach(unit)

    def _post_accumulate(self, parameter: torch.Tensor) -> None:
        unit = self._owner[id(parameter)]
        if unit.machine.state is not State.BACKWARD_PRE or not unit.attached:
            raise OffloadStateError(
                f"offload: a parameter of {unit.storage.name} received a gradient while the "
                f"module was {unit.machine.state.name}, not in its backward; its gradient "
                "cannot be accumulated correctly. Use each parameter only inside its module's "
                "forward (read other modules' outputs, not their parameters), then call "
                "recover()."
            )
        self._mover.add_held(unit, parameter)
        self._mover.grad_to_host(unit, parameter)
        unit.fired.add(id(parameter))
        if unit.fired >= unit.trainable:
            unit.machine.enter(State.BACKWARD_POST, why="every parameter has its gradient")
            self._mover.detach(unit)
            self._mover.drop(unit)

    def _final_callback(self) -> None:
        self._callback_queued = False
        self._backward_order.finish()
        forward = [u.storage.name for u in self._units if u.machine.state is State.FORWARD]
        for unit in self._units:
            if unit.machine.state is not State.FORWARD:
                unit.machine.enter(State.IDLE, why="backward finished")
            self._mover.detach(unit)
            self._mover.drop(unit)
        self._mover.transfers.wait_host()
        if forward:
            for unit in self._units:
                unit.machine.reset()
                unit.users = 0
            raise OffloadStateError(
                f"offload: backward finished while {', '.join(forward)} was still in its "
                "forward; a forward hook did not run. Every parameter is back in host memory."
            )

    def _alias_view(self, saved: Alias) -> torch.Tensor:
        unit = self._units[saved.unit]
        if not unit.attached:
            self._pre_backward(unit)
        assert unit.flats is not None
        return unit.flats[saved.dtype].as_strided(saved.size, saved.stride, saved.offset)

    # Recovery and removal -------------------------------------------------------------

    def recover(self) -> None:
        """Bring every parameter and gradient back to host memory and every unit to IDLE.

        Call it after an exception escaped ``loss.backward()`` (autograd runs no callback
        then); :meth:`offload.Engine.backward` and the next forward call it for you.
        Gradients keep every contribution that was fully accumulated before the failure.
        """
        for unit in self._units:
            self._mover.detach(unit)
            self._mover.drop(unit)
            unit.machine.reset()
            unit.fired.clear()
            unit.users = 0
            unit.resumes_backward = False
            while unit.cache_states:
                torch.set_autocast_cache_enabled(unit.cache_states.pop())
        self._saved.exit()
        if self._interception is not None:
            self._interception.reset()
        self._depth = 0
        self._callback_queued = False
        self._mover.transfers.wait_host()

    def remove(self) -> None:
        """Undo :func:`offload_parameters`: hooks removed, tensors back where they were.

        Parameters, gradients and buffers return to their original devices and strides,
        with their current values; the module is as if it had never been offloaded.

        Raises:
            offload.OffloadStateError: A forward or backward is still running.
        """
        if self._removed:
            return
        if self.state is not State.IDLE or self._depth:
            raise OffloadStateError(
                f"offload: cannot remove the parameter offload while the model is in "
                f"{self.state.name}; call remove() between steps (or recover() first)."
            )
        self._mover.transfers.wait_host()
        self._mover.pool.clear()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        with torch.no_grad():
            for tensor, device, stride in self._origins:
                tensor.data = restored(tensor.data, device, stride)
                if isinstance(tensor, nn.Parameter) and tensor.grad is not None:
                    tensor.grad = restored(tensor.grad, device, stride)
        for unit in self._units:
            unit.storage.flats.clear()
        self._removed = True
