"""``offload_parameters``: keep any model's parameters in host memory, load them per module.

Each chosen submodule (a *unit*) has its parameters packed into pinned host memory.
Hooks move them:

* the root's forward pre-hook starts a step (bringing back anything a failed step left
  behind) and saves tensors autograd keeps from a unit's parameters as references, so
  that dropping the unit really frees its device memory;
* a unit's forward pre-hook loads its parameters (unless prefetched) and prefetches the
  next ``prefetch`` units in execution order, learned on the first forward; its forward
  post-hook (which runs even when forward raises) drops them and registers a
  pre-backward hook on each output tensor, once per tensor;
* the pre-backward hook loads the parameters and the host gradients again (and
  prefetches the units before it); each parameter's post-accumulate-grad hook copies
  its gradient to the host as soon as it is accumulated; once every parameter of the
  unit has its gradient the unit is dropped;
* one final callback, queued from the outermost backward through the root's outputs,
  waits for the copies and returns every unit to ``IDLE``.

Every unit follows the asserted state machine of :mod:`offload._state`. Reentrant
checkpoints (:func:`checkpointing.checkpoint`) rerun forward hooks during backward and
run nested backward passes whose callbacks fire early; the hooks are idempotent and the
final callback hangs off the root's outputs, so both are handled.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

import accel
from accel import Accelerator
from checkpointing import is_recomputing

from . import _transfer
from ._errors import OffloadConfigError, OffloadStateError
from ._slices import SliceStorage
from ._state import State, StateMachine
from ._transfer import Transfers, dense_stride, resolve_device

__all__ = ["ParameterOffload", "active_offloads", "offload_parameters"]

# Module -> its handle. Both weak: the module's hooks keep the handle alive, and a model
# that is dropped without remove() must not be kept alive by this registry.
_ACTIVE: weakref.WeakKeyDictionary[nn.Module, weakref.ref[ParameterOffload]] = (
    weakref.WeakKeyDictionary()
)
_ACTIVE_LOCK = threading.Lock()


def active_offloads(module: nn.Module) -> list[ParameterOffload]:
    """Return the parameter offloads installed on ``module`` or any of its submodules."""
    with _ACTIVE_LOCK:
        refs = [_ACTIVE.get(m) for m in module.modules()]
    handles = [ref() for ref in refs if ref is not None]
    return [handle for handle in handles if handle is not None]


@dataclass
class _Order:
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


@dataclass(frozen=True)
class _Alias:
    """A saved tensor that was a view of a unit's device parameters."""

    unit: int
    dtype: torch.dtype
    size: torch.Size
    stride: tuple[int, ...]
    offset: int


@dataclass
class _Unit:
    """One module whose parameters are offloaded, and where they are right now."""

    index: int
    module: nn.Module
    storage: SliceStorage
    machine: StateMachine
    flats: dict[torch.dtype, torch.Tensor] | None = None
    loaded: Any = None
    device_grads: dict[int, torch.Tensor] | None = None
    stashed: dict[int, torch.Tensor | None] = field(default_factory=dict)
    attached: bool = False
    fired: set[int] = field(default_factory=set)
    resumes_backward: bool = False

    @property
    def trainable(self) -> set[int]:
        return {id(p) for p in self.storage.parameters if p.requires_grad}


def _names(root: nn.Module) -> dict[int, str]:
    return {id(module): name or "<root>" for name, module in root.named_modules()}


class ParameterOffload:
    """The handle :func:`offload_parameters` returns; :meth:`remove` undoes everything.

    Attributes are read-only views for tests and monitoring: :attr:`state`,
    :attr:`states`, :attr:`resident_modules`, :attr:`max_resident`,
    :attr:`execution_order`.
    """

    def __init__(
        self,
        module: nn.Module,
        units: Sequence[nn.Module],
        *,
        unit_parameters: Sequence[Sequence[nn.Parameter]],
        prefetch: int,
        backend: Accelerator,
        device: torch.device,
        copy: bool,
    ) -> None:
        self.module = module
        self.backend = backend
        self.device = device
        self.prefetch = prefetch
        self._copy = copy
        self._transfers = Transfers(backend)
        names = _names(module)
        self._origins: list[tuple[torch.Tensor, torch.device, tuple[int, ...], bool]] = []
        covered = {id(p) for params in unit_parameters for p in params}
        for parameter in module.parameters():
            self._origins.append(
                (parameter, parameter.device, parameter.stride(), id(parameter) in covered)
            )
        for buffer in module.buffers():
            self._origins.append((buffer, buffer.device, buffer.stride(), False))
        self._units: list[_Unit] = []
        self._owner: dict[int, _Unit] = {}
        for index, (unit_module, params) in enumerate(zip(units, unit_parameters, strict=True)):
            label = f"module {names.get(id(unit_module), '?')!r} ({type(unit_module).__name__})"
            storage = SliceStorage(
                index, label, [unit_module], params, [], self._transfers, copy=copy
            )
            unit = _Unit(index, unit_module, storage, StateMachine(label))
            self._units.append(unit)
            for unit_parameter in storage.parameters:
                self._owner[id(unit_parameter)] = unit
        if copy:
            with torch.no_grad():
                for tensor, _, _, is_unit_parameter in self._origins:
                    if not is_unit_parameter and tensor.device != device:
                        tensor.data = tensor.data.to(device)
        self._forward_order = _Order()
        self._backward_order = _Order()
        self._prefetched: list[int] = []
        self._depth = 0
        self._saved_hooks: Any = None
        self._callback_queued = False
        self._storage_owner: dict[int, tuple[int, torch.dtype]] = {}
        self._max_resident = 0
        self._removed = False
        self._handles: list[RemovableHandle] = []
        self._install_hooks()
        with _ACTIVE_LOCK:
            _ACTIVE[module] = weakref.ref(self)

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
        return tuple(unit.storage.name for unit in self._units if unit.flats is not None)

    @property
    def max_resident(self) -> int:
        """The most units that were in device memory at once."""
        return self._max_resident

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

    def _install_hooks(self) -> None:
        # Hooks hold the handle weakly: autograd keeps tensor hooks in C++, where the
        # garbage collector cannot see a cycle back to the model.
        root = self.module
        self._handles.append(
            root.register_forward_pre_hook(_weak(self, "_root_pre_forward"), prepend=True)
        )
        self._handles.append(
            root.register_forward_hook(_weak(self, "_root_post_forward"), always_call=True)
        )
        for unit in self._units:
            self._handles.append(
                unit.module.register_forward_pre_hook(_weak(self, "_pre_forward", unit))
            )
            self._handles.append(
                unit.module.register_forward_hook(
                    _weak(self, "_post_forward", unit), always_call=True
                )
            )
            for parameter in unit.storage.parameters:
                if parameter.requires_grad:
                    self._handles.append(
                        parameter.register_post_accumulate_grad_hook(
                            _weak(self, "_post_accumulate")
                        )
                    )

    def _root_pre_forward(self, module: nn.Module, args: Any) -> None:
        if self._depth == 0 and not is_recomputing():
            if self.state is not State.IDLE:
                self.recover()
            for unit in self._units:
                if not unit.attached:
                    self._drop(unit)
        if self._depth == 0 and self._copy and torch.is_grad_enabled():
            self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
            self._saved_hooks.__enter__()
        self._depth += 1

    def _root_post_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        self._depth -= 1
        if self._depth > 0:
            return
        if self._saved_hooks is not None:
            hooks, self._saved_hooks = self._saved_hooks, None
            hooks.__exit__(None, None, None)
        self._forward_order.finish()
        for unit in self._units:
            if not unit.attached:
                self._drop(unit)
        if output is not None and torch.is_grad_enabled():
            for tensor in _tensors(output):
                if tensor.requires_grad:
                    tensor.register_hook(_weak(self, "_root_pre_backward"))

    def _pre_forward(self, module: nn.Module, args: Any, unit: _Unit) -> None:
        recomputing = is_recomputing()
        previous = unit.machine.enter(
            State.FORWARD, recomputing=recomputing, why="its forward started"
        )
        unit.resumes_backward = previous is State.BACKWARD_PRE
        if not recomputing:
            self._forward_order.see(unit.index)
        if not unit.attached:
            self._claim(unit, grads=False)
            if not recomputing:  # the forward order says nothing about a recomputed region
                self._prefetch(self._forward_order.after(unit.index, self.prefetch), grads=False)
            self._attach(unit)

    def _post_forward(self, module: nn.Module, args: Any, output: Any, unit: _Unit) -> None:
        if unit.machine.state is not State.FORWARD:
            return  # the pre-hook failed (a state error); nothing was loaded for this call
        if unit.resumes_backward:
            unit.machine.enter(State.BACKWARD_PRE, recomputing=True, why="recomputed forward ended")
        else:
            unit.machine.enter(State.IDLE, why="its forward ended")
            self._detach(unit)
            self._drop(unit)
        if output is not None and torch.is_grad_enabled():
            hook = _weak(self, "_pre_backward", unit, drop_args=True)
            for tensor in _tensors(output):
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

    def _pre_backward(self, unit: _Unit) -> None:
        # Normally queued by the root's outputs already; this covers a backward that
        # reaches a unit without passing through them.
        self._queue_final_callback()
        previous = unit.machine.enter(State.BACKWARD_PRE, why="backward reached its outputs")
        if previous is not State.BACKWARD_PRE:
            unit.fired.clear()
        self._backward_order.see(unit.index)
        if not unit.attached:
            self._claim(unit, grads=True)
            self._prefetch(self._backward_order.after(unit.index, self.prefetch), grads=True)
            self._attach(unit)

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
        if self._copy and parameter.grad is not None:
            host = unit.storage.host_grad(self._entry(unit, parameter), self._transfers)
            self._transfers.copy_waits_for_compute()
            with self._transfers.on_copy_stream():
                host.copy_(parameter.grad, non_blocking=self._transfers.non_blocking)
                self._transfers.used_by(parameter.grad, self._transfers.stream)
            self._transfers.copy_event()
            unit.stashed[id(parameter)] = host
        unit.fired.add(id(parameter))
        if unit.fired >= unit.trainable:
            unit.machine.enter(State.BACKWARD_POST, why="every parameter has its gradient")
            self._detach(unit)
            self._drop(unit)

    def _final_callback(self) -> None:
        self._callback_queued = False
        self._backward_order.finish()
        forward = [u.storage.name for u in self._units if u.machine.state is State.FORWARD]
        for unit in self._units:
            if unit.machine.state is not State.FORWARD:
                unit.machine.enter(State.IDLE, why="backward finished")
            self._detach(unit)
            self._drop(unit)
        self._transfers.wait_host()
        if forward:
            for unit in self._units:
                unit.machine.reset()
            raise OffloadStateError(
                f"offload: backward finished while {', '.join(forward)} was still in its "
                "forward; a forward hook did not run. Every parameter is back in host memory."
            )

    # Saved tensors --------------------------------------------------------------------

    def _pack(self, tensor: torch.Tensor) -> Any:
        if tensor.device != self.device or not self._storage_owner:
            return tensor
        owner = self._storage_owner.get(tensor.untyped_storage().data_ptr())
        if owner is None:
            return tensor
        return _Alias(
            owner[0], owner[1], tensor.shape, tensor.stride(), int(tensor.storage_offset())
        )

    def _unpack(self, saved: Any) -> torch.Tensor:
        if not isinstance(saved, _Alias):
            return saved  # type: ignore[no-any-return]
        unit = self._units[saved.unit]
        if not unit.attached:
            self._pre_backward(unit)
        assert unit.flats is not None
        return unit.flats[saved.dtype].as_strided(saved.size, saved.stride, saved.offset)

    # Moving parameters ----------------------------------------------------------------

    def _entry(self, unit: _Unit, parameter: torch.Tensor) -> Any:
        for entry in unit.storage.flats[parameter.dtype].entries:
            if entry.tensor is parameter:
                return entry
        raise AssertionError("offload internal error: parameter not packed")

    def _claim(self, unit: _Unit, *, grads: bool) -> None:
        """Start loading ``unit`` (unless prefetched) for use now: no longer a prefetch."""
        if unit.index in self._prefetched:
            self._prefetched.remove(unit.index)
        self._issue(unit, grads=grads)

    def _prefetch(self, indices: Sequence[int], *, grads: bool) -> None:
        """Start loading the units ``indices``; at most ``prefetch`` wait unused at once."""
        for index in indices:
            unit = self._units[index]
            if unit.attached:
                continue
            if index in self._prefetched:
                self._prefetched.remove(index)
            while len(self._prefetched) >= max(self.prefetch, 1):
                stale = self._units[self._prefetched.pop(0)]
                if not stale.attached:
                    self._drop(stale)
            self._issue(unit, grads=grads)
            self._prefetched.append(index)

    def _issue(self, unit: _Unit, *, grads: bool) -> None:
        """Start copying ``unit``'s parameters (and host gradients) to the device."""
        transfers = self._transfers
        if unit.flats is None:
            unit.flats = {}
            if self._copy:
                with transfers.on_copy_stream() as compute:
                    for dtype, flat in unit.storage.flats.items():
                        assert flat.host is not None
                        device = torch.empty(flat.host.numel(), dtype=dtype, device=self.device)
                        device.copy_(flat.host, non_blocking=transfers.non_blocking)
                        transfers.used_by(device, compute)
                        unit.flats[dtype] = device
                unit.loaded = transfers.copy_event()
            self._max_resident = max(self._max_resident, len(self.resident_modules))
        if grads and unit.device_grads is None:
            unit.device_grads = {}
            if self._copy:
                with transfers.on_copy_stream() as compute:
                    for parameter in unit.storage.parameters:
                        host = unit.stashed.get(id(parameter)) if unit.attached else parameter.grad
                        if host is None:
                            continue
                        device = torch.empty_strided(
                            parameter.shape,
                            dense_stride(parameter),
                            dtype=host.dtype,
                            device=self.device,
                        )
                        device.copy_(host, non_blocking=transfers.non_blocking)
                        transfers.used_by(device, compute)
                        unit.device_grads[id(parameter)] = device
                unit.loaded = transfers.copy_event()

    def _attach(self, unit: _Unit) -> None:
        """Point ``unit``'s parameters at their device copies (after the copy finished)."""
        unit.attached = True
        if unit.index in self._prefetched:
            self._prefetched.remove(unit.index)
        if not self._copy:
            return
        assert unit.flats is not None
        self._transfers.compute_waits(unit.loaded)
        for parameter in unit.storage.parameters:
            unit.stashed[id(parameter)] = parameter.grad
            parameter.grad = None
        for dtype, flat in unit.storage.flats.items():
            device = unit.flats[dtype]
            self._storage_owner[device.untyped_storage().data_ptr()] = (unit.index, dtype)
            for entry in flat.entries:
                entry.tensor.data = entry.view(device)
        for parameter in unit.storage.parameters:
            grad = (unit.device_grads or {}).get(id(parameter))
            if grad is not None:
                parameter.grad = grad

    def _detach(self, unit: _Unit) -> None:
        """Point ``unit``'s parameters back at host memory, with their host gradients."""
        if not unit.attached:
            return
        unit.attached = False
        if not self._copy:
            return
        for parameter in unit.storage.parameters:
            parameter.grad = None
        for entry in unit.storage.entries():
            entry.tensor.data = entry.home
        for parameter in unit.storage.parameters:
            parameter.grad = unit.stashed.pop(id(parameter), None)

    def _drop(self, unit: _Unit) -> None:
        """Release ``unit``'s device copies (it must be detached)."""
        if unit.attached:
            return
        if unit.index in self._prefetched:
            self._prefetched.remove(unit.index)
        if unit.flats is not None:
            for device in unit.flats.values():
                self._storage_owner.pop(device.untyped_storage().data_ptr(), None)
        unit.flats = None
        unit.device_grads = None
        unit.loaded = None

    # Recovery and removal -------------------------------------------------------------

    def recover(self) -> None:
        """Bring every parameter and gradient back to host memory and every unit to IDLE.

        Call it after an exception escaped ``loss.backward()`` (autograd runs no callback
        then); :meth:`offload.Engine.backward` and the next forward call it for you.
        Gradients keep every contribution that was fully accumulated before the failure.
        """
        for unit in self._units:
            self._detach(unit)
            self._drop(unit)
            unit.machine.reset()
            unit.fired.clear()
            unit.resumes_backward = False
        self._callback_queued = False
        self._transfers.wait_host()

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
        self._transfers.wait_host()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        with torch.no_grad():
            for tensor, device, stride, _ in self._origins:
                tensor.data = _restored(tensor.data, device, stride)
                if isinstance(tensor, nn.Parameter) and tensor.grad is not None:
                    tensor.grad = _restored(tensor.grad, device, stride)
        for unit in self._units:
            unit.storage.flats.clear()
        self._removed = True
        with _ACTIVE_LOCK:
            ref = _ACTIVE.get(self.module)
            if ref is not None and ref() is self:
                del _ACTIVE[self.module]

    def __repr__(self) -> str:
        return (
            f"ParameterOffload(units={len(self._units)}, prefetch={self.prefetch}, "
            f"device={self.device}, state={self.state.name})"
        )


def _weak(
    owner: ParameterOffload, method: str, *bound: Any, drop_args: bool = False
) -> Callable[..., None]:
    """Return a hook calling ``owner.method(*args, *bound)`` while ``owner`` is alive."""
    ref = weakref.ref(owner)

    def hook(*args: Any) -> None:
        target = ref()
        if target is not None:
            getattr(target, method)(*(() if drop_args else args), *bound)

    return hook


def _restored(tensor: torch.Tensor, device: torch.device, stride: tuple[int, ...]) -> torch.Tensor:
    fresh = torch.empty_strided(tensor.shape, stride, dtype=tensor.dtype, device=device)
    fresh.copy_(tensor)
    return fresh


def _tensors(value: Any, depth: int = 0) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if depth > 4:
        return []
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item, depth + 1)]
    if isinstance(value, list | tuple):
        return [t for item in value for t in _tensors(item, depth + 1)]
    return []


def _default_units(module: nn.Module) -> list[tuple[nn.Module, list[nn.Parameter]]]:
    units = []
    for submodule in module.modules():
        direct = list(submodule.parameters(recurse=False))
        if direct:
            units.append((submodule, direct))
    return units


def offload_parameters(
    module: nn.Module,
    *,
    prefetch: int = 1,
    backend: Accelerator | None = None,
    device: torch.device | str | None = None,
    modules: Iterable[nn.Module] | None = None,
) -> ParameterOffload:
    """Keep ``module``'s parameters in host memory and load each submodule's when it runs.

    Works for any model (branches, skip connections, shared submodules called twice),
    also inside reentrant checkpoints. Buffers, and parameters outside the chosen
    submodules, move to the device. Gradients are copied to the host as they are
    accumulated, so an optimizer over ``module.parameters()`` steps on the host once
    ``backward`` returns. Feed the model inputs on the device.

    Example::

        handle = offload_parameters(model, prefetch=2)
        loss = model(x.to(handle.device)).sum()
        loss.backward()
        optimizer.step()
        handle.remove()          # the model is exactly as before, with its new weights

    Args:
        module: The model.
        prefetch: How many submodules ahead (in forward) or behind (in backward) to load
            while the current one computes; 0 loads each one when it is needed.
        backend: The backend; ``None`` means :func:`accel.get_backend`.
        device: Where to compute; ``None`` means ``backend.device()``.
        modules: The submodules whose parameters to offload, each as a whole (they must
            not share parameters). Default: every submodule that owns parameters
            directly, each with those parameters.

    Returns:
        The handle: :meth:`ParameterOffload.remove`, :meth:`ParameterOffload.recover`,
        and read-only state for monitoring.

    Raises:
        offload.OffloadConfigError: A bad ``prefetch``, an unusable device, ``module``
            already offloaded, or a parameter in two chosen submodules.
    """
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
        raise OffloadConfigError(f"offload: prefetch must be an int >= 0, got {prefetch!r}.")
    if not isinstance(module, nn.Module):
        raise OffloadConfigError(
            f"offload: offload_parameters needs an nn.Module, got {type(module).__name__}."
        )
    with _ACTIVE_LOCK:
        roots = list(_ACTIVE.keys())
        inside = any(any(m is module for m in root.modules()) for root in roots)
        if inside or any(m in _ACTIVE for m in module.modules()):
            raise OffloadConfigError(
                "offload: this module (or a submodule) already has its parameters offloaded; "
                "call remove() on the existing handle first."
            )
    backend = accel.get_backend() if backend is None else backend
    compute_device = resolve_device(device, backend)
    if modules is None:
        chosen = _default_units(module)
    else:
        chosen = [(m, list(m.parameters())) for m in modules]
    owner: dict[int, nn.Module] = {}
    names = _names(module)
    for unit_module, params in chosen:
        for parameter in params:
            first = owner.setdefault(id(parameter), unit_module)
            if first is not unit_module:
                raise OffloadConfigError(
                    f"offload: a parameter is shared by modules "
                    f"{names.get(id(first), '?')!r} and {names.get(id(unit_module), '?')!r}; "
                    "each parameter must belong to one offloaded module. Pass modules= with "
                    "a module that contains both (their common parent)."
                )
    return ParameterOffload(
        module,
        [m for m, _ in chosen],
        unit_parameters=[params for _, params in chosen],
        prefetch=prefetch,
        backend=backend,
        device=compute_device,
        copy=_transfer.copies_needed(compute_device, torch.device("cpu")),
    )
