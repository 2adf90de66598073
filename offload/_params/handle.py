"""The handle of :func:`offload.offload_parameters`, its two strategies, and the registry.

One handle, :class:`ParameterOffload`, whatever the device; what it does is one of two
named strategies:

* :class:`offload._params.swap.SwapData`: each parameter's ``.data`` is pointed at its device
  copy while its module runs (CUDA, Gaudi, the host);
* :class:`offload._params.copied.CopyParameters`: parameters reach the device as
  differentiable copies, for a device whose tensors cannot take a host tensor's place
  (PyTorch/XLA, a PrivateUse1 device).

The registry maps each offloaded model to its handle, weakly both ways: the model keeps
its handle alive through its root hook, and a model dropped without ``remove()`` is not
kept alive by the registry.
"""

from __future__ import annotations

import threading
import weakref
from typing import Protocol

import torch
from torch import nn

from accel import Accelerator

from .._state import State

__all__ = ["ParameterOffload", "Strategy", "active_offloads", "offloaded_roots"]

_ACTIVE: weakref.WeakKeyDictionary[nn.Module, weakref.ref[ParameterOffload]] = (
    weakref.WeakKeyDictionary()
)
_ACTIVE_LOCK = threading.Lock()


class Strategy(Protocol):
    """What a strategy gives its handle: state for monitoring, recovery and removal."""

    @property
    def state(self) -> State: ...

    @property
    def states(self) -> dict[str, State]: ...

    @property
    def resident_modules(self) -> tuple[str, ...]: ...

    @property
    def max_resident(self) -> int: ...

    @property
    def execution_order(self) -> tuple[str, ...]: ...

    @property
    def backward_order(self) -> tuple[str, ...]: ...

    def is_home(self) -> bool: ...

    def recover(self) -> None: ...

    def remove(self) -> None: ...


class ParameterOffload:
    """The handle :func:`offload_parameters` returns; :meth:`remove` undoes everything.

    :meth:`of` finds it again from the model. Attributes are read-only views for tests
    and monitoring: :attr:`state`, :attr:`states`, :attr:`resident_modules`,
    :attr:`max_resident`, :attr:`execution_order`, :attr:`backward_order`;
    :attr:`strategy` is the strategy at work (``"swap-data"`` or ``"copy-parameters"``
    in :attr:`strategy_name`).

    Args:
        module: The model.
        backend: The backend.
        device: The compute device.
        prefetch: How many modules to load ahead.
    """

    def __init__(
        self, module: nn.Module, *, backend: Accelerator, device: torch.device, prefetch: int
    ) -> None:
        self.module = module
        self.backend = backend
        self.device = device
        self.prefetch = prefetch
        self._strategy: Strategy | None = None
        self.strategy_name = ""

    def start(self, strategy: Strategy, name: str) -> ParameterOffload:
        """Put ``strategy`` (whose hooks are installed) to work and register the handle."""
        self._strategy, self.strategy_name = strategy, name
        with _ACTIVE_LOCK:
            _ACTIVE[self.module] = weakref.ref(self)
        return self

    @classmethod
    def of(cls, module: nn.Module) -> ParameterOffload | None:
        """Return the handle of ``offload_parameters(module)``, or ``None`` if there is none.

        Offloading stays in force until :meth:`remove`, even when the handle returned by
        :func:`offload.offload_parameters` was not kept: this gets it back.
        """
        with _ACTIVE_LOCK:
            ref = _ACTIVE.get(module)
        return None if ref is None else ref()

    @property
    def strategy(self) -> Strategy:
        """The strategy at work."""
        assert self._strategy is not None, "offload internal error: a handle never started"
        return self._strategy

    @property
    def state(self) -> State:
        """``IDLE`` when every unit is idle, else the state of the first unit that is not."""
        return self.strategy.state

    @property
    def states(self) -> dict[str, State]:
        """Each unit's state, by the unit's name."""
        return self.strategy.states

    @property
    def resident_modules(self) -> tuple[str, ...]:
        """Names of the units whose parameters are in device memory now."""
        return self.strategy.resident_modules

    @property
    def max_resident(self) -> int:
        """The most units that were in device memory at once."""
        return self.strategy.max_resident

    @property
    def execution_order(self) -> tuple[str, ...]:
        """The units in the order the first forward ran them (used for prefetching)."""
        return self.strategy.execution_order

    @property
    def backward_order(self) -> tuple[str, ...]:
        """The units in the order the first backward reached them."""
        return self.strategy.backward_order

    def is_home(self) -> bool:
        """Whether every offloaded parameter is in its host memory, with host gradients."""
        return self.strategy.is_home()

    def recover(self) -> None:
        """Bring every parameter and gradient back to host memory and every unit to IDLE.

        Call it after an exception escaped ``loss.backward()`` (autograd runs no callback
        then); :meth:`offload.Engine.backward` and the next forward call it for you.
        Gradients keep every contribution that was fully accumulated before the failure.
        """
        self.strategy.recover()

    def remove(self) -> None:
        """Undo :func:`offload_parameters`: hooks removed, tensors back where they were.

        Parameters, gradients and buffers return to their original devices and strides,
        with their current values; the module is as if it had never been offloaded.

        Raises:
            offload.OffloadStateError: A forward or backward is still running.
        """
        self.strategy.remove()
        with _ACTIVE_LOCK:
            ref = _ACTIVE.get(self.module)
            if ref is not None and ref() is self:
                del _ACTIVE[self.module]

    def __repr__(self) -> str:
        return (
            f"ParameterOffload(strategy={self.strategy_name}, prefetch={self.prefetch}, "
            f"device={self.device}, state={self.state.name})"
        )


def active_offloads(module: nn.Module) -> list[ParameterOffload]:
    """Return the parameter offloads installed on ``module`` or any of its submodules."""
    with _ACTIVE_LOCK:
        refs = [_ACTIVE.get(m) for m in module.modules()]
    handles = [ref() for ref in refs if ref is not None]
    return [handle for handle in handles if handle is not None]


def offloaded_roots() -> list[nn.Module]:
    """Return every model whose parameters are offloaded now."""
    with _ACTIVE_LOCK:
        return list(_ACTIVE.keys())
