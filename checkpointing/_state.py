"""What a recomputation must see again, captured in forward and replayed in backward.

A checkpointed function runs twice: once in forward, once when backward needs its
activations. For the second run to give the first run's tensors it must see the same
generator states (dropout masks) and the same autocast state (dtypes); on a lazy
device its inputs also pass a recompute barrier (:func:`accel.recompute_barrier`), so
that the device compiler cannot merge the recomputation back into the forward. It must
also leave no trace of its own: modules that track running statistics (batch norm) must
not update them a second time.

Everything device-specific goes through the :class:`accel.Accelerator` protocol.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from accel import Accelerator, recompute_barrier

__all__ = ["ForwardState", "Options", "is_recomputing", "recomputation", "rng_devices"]


class _ThreadState(threading.local):
    """Per-thread bookkeeping: recomputation depth and the active running-stat guards."""

    def __init__(self) -> None:
        self.depth = 0
        self.guards: list[_RunningStatsGuard] = []


_local = _ThreadState()


def is_recomputing() -> bool:
    """Return whether this thread is re-running a checkpointed function for backward.

    Code inside a checkpointed function can use it to skip side effects (logging,
    counters) that must happen once per step, not once per run of the function.

    Returns:
        ``True`` between the start and the end of a recomputation on this thread.
    """
    return _local.depth > 0


@dataclass(frozen=True)
class Options:
    """How one checkpointed call runs.

    Attributes:
        backend: The backend whose RNG, autocast, ``mark_step`` and memory to use.
        preserve_rng_state: Whether to replay the generator states in recomputation.
        offload: Whether to keep the inputs in host memory until backward.
    """

    backend: Accelerator
    preserve_rng_state: bool
    offload: bool = False


def _cpu_autocast_kwargs() -> dict[str, Any]:
    return {
        "device_type": "cpu",
        "enabled": torch.is_autocast_enabled("cpu"),
        "dtype": torch.get_autocast_dtype("cpu"),
        "cache_enabled": torch.is_autocast_cache_enabled(),
    }


def rng_devices(values: Iterable[Any], device_type: str) -> list[int] | None:
    """Return the device indices of the ``device_type`` tensors in ``values``, sorted.

    ``None`` when none of them names an index (no such tensor, or a device without
    indices): the current device's generator is the one to capture then.
    """
    indices = {
        value.device.index
        for value in values
        if isinstance(value, torch.Tensor)
        and value.device.type == device_type
        and value.device.index is not None
    }
    return sorted(indices) if indices else None


@dataclass
class ForwardState:
    """The state a checkpointed forward ran under, for the recomputation to replay.

    Attributes:
        backend: The backend the function runs on.
        device_autocast: ``backend.autocast_kwargs()`` at forward time.
        cpu_autocast: The host autocast state at forward time, or ``None`` when the
            backend computes on the host (its autocast state is then the host's).
        cpu_rng: The host generator state, or ``None`` without ``preserve_rng_state``.
        device_rng: The device generator states, by device index (``None``: the
            current device), or ``None`` without ``preserve_rng_state``. Like torch,
            the forward captures the generator of every device its inputs live on, so
            a recomputation running on another current device (each device's backward
            runs on its own thread) replays the right one.
    """

    backend: Accelerator
    device_autocast: dict[str, Any]
    cpu_autocast: dict[str, Any] | None
    cpu_rng: torch.Tensor | None
    device_rng: dict[int | None, torch.Tensor] | None

    @classmethod
    def capture(
        cls, backend: Accelerator, preserve_rng_state: bool, inputs: Iterable[Any] = ()
    ) -> ForwardState:
        """Read the autocast state and, if asked, the generator states, through ``backend``.

        Args:
            backend: The backend to read through.
            preserve_rng_state: Whether to read the generator states.
            inputs: The checkpointed function's arguments; the generators of the
                devices their tensors live on are read (the current device's when
                none of them is on an indexed device of ``backend``'s type).
        """
        device_autocast = backend.autocast_kwargs()
        on_host = device_autocast.get("device_type", backend.device_type) == "cpu"
        cpu_rng = None
        device_rng: dict[int | None, torch.Tensor] | None = None
        if preserve_rng_state:
            cpu_rng = torch.get_rng_state()
            devices = rng_devices(inputs, backend.device_type)
            if devices is None:
                device_rng = {None: backend.get_rng_state()}
            else:
                device_rng = {index: backend.get_rng_state(index) for index in devices}
        return cls(
            backend=backend,
            device_autocast=device_autocast,
            cpu_autocast=None if on_host else _cpu_autocast_kwargs(),
            cpu_rng=cpu_rng,
            device_rng=device_rng,
        )

    @property
    def preserves_rng(self) -> bool:
        """Whether the generator states were captured."""
        return self.device_rng is not None

    def fork_rng(self) -> AbstractContextManager[None]:
        """Return ``backend.fork_rng`` over the captured devices."""
        devices = [index for index in self.device_rng or {} if index is not None]
        if not devices:
            return self.backend.fork_rng()
        return self.backend.fork_rng(devices=devices)

    def restore_rng(self) -> None:
        """Set the host generator, then each captured device generator, to its state.

        On a host backend both are the same generator and get the same state, so the
        result is exact either way.
        """
        if self.cpu_rng is not None:
            torch.set_rng_state(self.cpu_rng)
        for index, state in (self.device_rng or {}).items():
            if index is None:
                self.backend.set_rng_state(state)
            else:
                self.backend.set_rng_state(state, index)


def _autocast(kwargs: dict[str, Any]) -> Any:
    device_type = kwargs["device_type"]
    if not torch.amp.is_autocast_available(device_type):
        return None
    return torch.autocast(**kwargs)


@contextmanager
def recomputation(state: ForwardState, inputs: Sequence[Any] = ()) -> Iterator[None]:
    """Re-enter the forward's state for the length of a recomputation.

    In order: put the tensors among ``inputs`` behind the backend's recompute barrier
    (:func:`accel.recompute_barrier`: a compiler's optimisation barrier, a ``mark_step()``
    on a lazy backend without one, nothing on an eager backend); enter
    ``backend.fork_rng()`` and restore the captured generator states (skipped
    entirely without ``preserve_rng_state``); enable grad; re-enter the device
    autocast state and the host one; mark this thread as recomputing; and guard the
    running statistics of modules called inside. On exit, also by exception, the
    caller's generators, autocast state, grad mode and running statistics are back
    as they were.

    Args:
        state: What :meth:`ForwardState.capture` read in forward.
        inputs: What the recomputation reads: the function's arguments and, where
            known, the gradients arriving at its outputs.
    """
    backend = state.backend
    recompute_barrier(backend, [value for value in inputs if isinstance(value, torch.Tensor)])
    with ExitStack() as stack:
        if state.preserves_rng:
            stack.enter_context(state.fork_rng())
            state.restore_rng()
        stack.enter_context(torch.enable_grad())
        for kwargs in (state.device_autocast, state.cpu_autocast):
            if kwargs is not None:
                context = _autocast(kwargs)
                if context is not None:
                    stack.enter_context(context)
        stack.enter_context(_recomputing())
        stack.enter_context(_RunningStatsGuard())
        yield


@contextmanager
def _recomputing() -> Iterator[None]:
    _local.depth += 1
    try:
        yield
    finally:
        _local.depth -= 1


class _RunningStatsGuard:
    """Keep modules called inside from updating their running statistics.

    While active, a global forward pre-hook finds every module in training mode with
    ``track_running_stats`` (batch norm, instance norm with tracking, and any module
    that follows that convention) the first time it is called on this thread, and
    gives it fresh copies of its buffers to update; on exit the original buffer
    objects are put back, untouched. The originals are never written to, so their
    version counters do not change (autograd's saved-tensor checks stay valid) and
    objects that hold on to them (distributed wrappers) see no change. In training
    mode the module's outputs do not depend on these buffers, so the recomputation
    is exact.
    """

    def __init__(self) -> None:
        self._thread = threading.get_ident()
        self._saved: dict[
            int, tuple[nn.Module, dict[str, torch.Tensor], dict[str, torch.Tensor]]
        ] = {}
        self._handle: Any = None

    def __enter__(self) -> _RunningStatsGuard:
        _local.guards.append(self)
        self._handle = nn.modules.module.register_module_forward_pre_hook(self._swap)
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self._handle.remove()
            self._restore()
        finally:
            _local.guards.remove(self)

    def _swap(self, module: nn.Module, args: Any) -> None:
        if threading.get_ident() != self._thread or _local.guards[-1] is not self:
            return
        if not module.training or not getattr(module, "track_running_stats", False):
            return
        if any(id(module) in guard._saved for guard in _local.guards):
            return
        originals = {name: buffer for name, buffer in module._buffers.items() if buffer is not None}
        with torch.no_grad():
            clones = {name: buffer.clone() for name, buffer in originals.items()}
        self._saved[id(module)] = (module, originals, clones)
        module._buffers.update(clones)

    def _restore(self) -> None:
        # Only where the clone is still in place: code that put its own tensor in a
        # buffer's place for the recomputation (and back) keeps what it put back.
        for module, originals, clones in self._saved.values():
            for name, buffer in originals.items():
                if module._buffers.get(name) is clones[name]:
                    module._buffers[name] = buffer
        self._saved.clear()
