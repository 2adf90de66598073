"""Profiling one training step of a model, for the memory-budget planner.

One plain forward runs under a dispatch mode and saved-tensor hooks that record, per
module: the storages autograd saves while it runs (each storage once, parameters and
buffers excluded, as :class:`SavedTensorMeter` counts), the storages of its tensor
inputs (what a checkpoint keeps instead), the outputs of the operators a selective
checkpoint keeps, and the time of its operators (the backend is synchronized around
each operator on asynchronous devices). On lazy devices operators do not run when
called, so each module is timed between ``mark_step`` and ``synchronize`` at its
boundaries and split between kept and recomputed operators by the bytes they write.
A clean forward gives the time the operators' timings are scaled to. Where operators
run when called, the forward runs twice more under a mode that only times each call,
and every call gets the median of its three timings (:mod:`._timings`), with the
spread of those timings as the profile's ``noise``.

No forward here keeps what autograd saves: the saved-tensor hooks record each tensor
and store nothing in its place, so profiling holds at most what an inference forward
holds, never the plain step's activations (the memory a budget is for). Nothing runs
backward; the planner times the plain step's backward through a checkpointed step
(:mod:`._budget`). Parameters, gradients, buffers and generator states are as they
were afterwards.
"""

from __future__ import annotations

import math
import statistics
import weakref
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from accel import Accelerator

from . import _clock
from ._replay import Geometry, Ref, replayable, template_of
from ._selective import is_saved_operator, written_tensors
from ._steps import call_model, dropping_saved, require_grad, tensors_of, timed_forward, untouched
from ._timings import repeated, timed_call

__all__ = ["ModuleProfile", "OpCall", "StepProfile", "profile_step"]


@dataclass
class OpCall:
    """One operator call inside a module's forward, as a selective policy sees it.

    ``occurrence`` counts the earlier calls of the same operator in that module's
    forward, which is how a policy recognises the call again. ``seconds`` is the
    operator's own time: keeping its output saves that, while the Python around it
    still runs in the recomputation.
    """

    name: str
    occurrence: int
    seconds: float
    fresh: tuple[int, ...]
    mutated: tuple[int, ...]
    read: tuple[int, ...]
    random: bool
    func: Any = None
    template: Any = None  # (args, kwargs) with tensors as Refs; None if not replayable
    outputs: tuple[int | None, ...] = ()  # each output tensor's new storage, or None


@dataclass
class ModuleProfile:
    """What one module's forward saved, took and received, in one plain step."""

    name: str
    kind: str = ""
    calls: int = 0
    repeated_input: bool = False
    running_stats: bool = False  # it or a module inside updates running statistics
    data_dependent: bool = False  # an operator inside has a data-dependent output shape
    fused_rnn: bool = False  # an nn.RNNBase (LSTM, GRU, RNN): one fused kernel per layer
    children: list[str] = field(default_factory=list)
    inputs: set[int] = field(default_factory=set)
    cached: set[int] = field(default_factory=set)
    forward_time: float = 0.0
    recomputed_time: float = 0.0
    written_bytes: int = 0
    recomputed_bytes: int = 0
    ops: list[OpCall] = field(default_factory=list)
    packs: list[tuple[int | None, Geometry]] = field(default_factory=list)
    input_order: list[int | None] = field(default_factory=list)


@dataclass
class StepProfile:
    """The recorded step: storages (by id), who saved them, and timings in seconds."""

    modules: dict[str, ModuleProfile]
    storage_bytes: dict[int, int]
    saved_by: dict[int, set[tuple[str, ...]]]
    step_time: float  # the plain step's, estimated (:func:`plain_step_time`); nan before
    forward_time: float
    plain_live_bytes: int = 0  # what a plain forward leaves alive (LiveActivationMeter)
    noise: float = 0.0  # relative standard deviation of an operator's median time

    @property
    def plain_bytes(self) -> int:
        """Bytes of the distinct storages autograd keeps in the plain step."""
        return sum(self.storage_bytes[index] for index in self.saved_by)


# Operators whose output shape or value the data decides (nonzero, masked_select, item):
# with them a module's operator calls and saved tensors can differ from step to step
# (mixture-of-experts routing), so positions and occurrences recorded once do not hold.
_DATA_DEPENDENT = tuple(
    tag
    for tag in (
        getattr(torch.Tag, "dynamic_output_shape", None),
        getattr(torch.Tag, "data_dependent_output", None),
    )
    if tag is not None
)


class _Recorder(TorchDispatchMode):
    """Gives every new storage an id, and charges operators to the running modules."""

    def __init__(self, backend: Accelerator, state_names: dict[int, str]) -> None:
        super().__init__()
        self.backend = backend
        self.excluded = set(state_names)
        self.state_names = state_names
        self.ids: dict[int, int] = {}
        self.storage_bytes: dict[int, int] = {}
        self.stack: list[ModuleProfile] = []
        self.occurrences: Counter[tuple[str, str]] = Counter()  # (module, operator) calls
        self.operator_time = 0.0  # the calls' medians, summed (:meth:`time_again`)
        self.per_operator = backend.is_asynchronous and not backend.is_lazy
        self.shaped_by_data: set[int] = set()  # storages created downstream of routing
        self.created: set[int] = set()  # storages an operator of the forward created
        self.freed: set[int] = set()  # created storages freed since
        self.names: list[str] = []  # every operator call, in order
        self.elapsed: list[float] = []  # its seconds
        self.made: list[list[OpCall]] = []  # its records, one per module around it

    def identify(self, tensor: torch.Tensor, new: bool = False) -> int | None:
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        if pointer == 0 or pointer in self.excluded:
            return None
        if new or pointer not in self.ids:
            index = self.ids[pointer] = len(self.storage_bytes)
            self.storage_bytes[index] = storage.nbytes()
            if new:
                self.created.add(index)
                # A finalizer, not a StorageWeakRef: on torch 2.4 a weak reference kept
                # the storage's Python object, and with it every activation of the
                # profiled forward, alive until planning ended.
                weakref.finalize(storage, self.freed.add, index)
        return self.ids[pointer]

    def ref(self, tensor: torch.Tensor) -> Ref | None:
        """Where ``tensor`` came from: a parameter or buffer by name, else its storage."""
        name = self.state_names.get(tensor.untyped_storage().data_ptr())
        if name is not None:
            return Ref("state", name, Geometry.of(tensor))
        index = self.identify(tensor)
        return None if index is None else Ref("storage", index, Geometry.of(tensor))

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        arguments = tensors_of((args, kwargs))
        out, elapsed = timed_call(func, args, kwargs, self.backend, self.per_operator)
        inputs = {t.untyped_storage().data_ptr() for t in arguments}
        outputs = tuple(
            None if t.untyped_storage().data_ptr() in inputs else self.identify(t, new=True)
            for t in tensors_of(out)
        )
        fresh = [index for index in outputs if index is not None]
        read = [index for t in arguments if (index := self.identify(t)) is not None]
        mutated = [
            index
            for t in written_tensors(func, args, kwargs)
            if (index := self.identify(t)) is not None
        ]
        written = sum(self.storage_bytes[index] for index in fresh)
        kept = is_saved_operator(func)
        name = str(func)
        random = torch.Tag.nondeterministic_seeded in func.tags
        data_dependent = any(tag in func.tags for tag in _DATA_DEPENDENT)
        if data_dependent or self.shaped_by_data.intersection(read):
            # The output's shape may follow the data too, unless an input whose shape
            # does not already has that shape (a residual add, an index_add_ target).
            steady = {
                tuple(t.shape)
                for t in arguments
                if t.untyped_storage().data_ptr() not in self.excluded
                and self.identify(t) not in self.shaped_by_data
            }
            for index, tensor in zip(outputs, tensors_of(out), strict=False):
                if index is not None and (data_dependent or tuple(tensor.shape) not in steady):
                    self.shaped_by_data.add(index)
        template = None
        if replayable(func) and self.stack:
            template, complete = template_of((args, kwargs), self.ref)
            template = template if complete else None
        made: list[OpCall] = []
        self.names.append(name)
        self.elapsed.append(elapsed)
        self.made.append(made)
        for module in self.stack:
            module.data_dependent |= data_dependent
            module.forward_time += elapsed
            module.written_bytes += written
            if kept:
                module.cached.update(fresh)
            else:
                module.recomputed_bytes += written
            # Every module, leaves included: a leaf that does its own work (an LSTM, a
            # user's childless layer) is a candidate at the operator grains too.
            occurrence = self.occurrences[module.name, name]
            self.occurrences[module.name, name] += 1
            call = OpCall(
                name,
                occurrence,
                elapsed,
                tuple(fresh),
                tuple(dict.fromkeys(mutated)),
                tuple(dict.fromkeys(read)),
                random,
                func,
                template,
                outputs,
            )
            module.ops.append(call)
            made.append(call)
        return out

    def time_again(self, model: nn.Module, example_inputs: Any) -> float:
        """Give each call its median over repeated forwards (:mod:`._timings`); the noise."""
        medians, noise = repeated(
            model, example_inputs, self.backend, self.names, self.elapsed, self.per_operator
        )
        for seconds, made in zip(medians, self.made, strict=True):
            for call in made:
                call.seconds = seconds
        self.operator_time = sum(medians)
        return noise


def _share_timings(modules: dict[str, ModuleProfile], storage_bytes: dict[int, int]) -> None:
    """Give modules doing the same work (repeated blocks) the median of their timings.

    Identical blocks cost the same; single timings of each are noisy on a busy host.
    So do identical operator calls (the same operator reading and writing storages of
    the same sizes: a block's two convolutions of one shape): each gets the median of
    them all, so that which of two equal calls a plan keeps or drops is not decided by
    timing noise but by their order, the same in every planning.
    """
    groups: dict[tuple[str, int, int], list[ModuleProfile]] = {}
    for record in modules.values():
        if record.calls == 1:
            key = (record.kind, record.written_bytes, record.recomputed_bytes)
            groups.setdefault(key, []).append(record)
    for group in groups.values():
        forward = statistics.median(record.forward_time for record in group)
        recomputed = statistics.median(record.recomputed_time for record in group)
        for record in group:
            record.forward_time, record.recomputed_time = forward, recomputed
        sequences = {tuple(call.name for call in record.ops) for record in group}
        if len(sequences) == 1:
            for calls in zip(*(record.ops for record in group), strict=True):
                seconds = statistics.median(call.seconds for call in calls)
                for call in calls:
                    call.seconds = seconds
    same: dict[tuple[Any, ...], list[OpCall]] = {}
    for record in modules.values():
        for call in record.ops:
            sizes = tuple(storage_bytes[index] for index in (*call.read, *call.fresh))
            same.setdefault((call.name, len(call.read), sizes), []).append(call)
    for equal in same.values():
        seconds = statistics.median(call.seconds for call in equal)
        for call in equal:
            call.seconds = seconds


def profile_step(model: nn.Module, example_inputs: Any, backend: Accelerator) -> StepProfile:
    """Record one plain step of ``model(*example_inputs)`` (see the module docstring).

    Args:
        model: The model, not yet checkpointed.
        example_inputs: A tuple of positional arguments or a dict of keyword arguments.
        backend: The backend the model runs on.

    Returns:
        The recorded profile.
    """
    names = {id(module): name for name, module in model.named_modules()}
    modules = {name: ModuleProfile(name) for name in names.values()}
    for name, module in model.named_modules():
        modules[name].kind = type(module).__qualname__
        modules[name].fused_rnn = isinstance(module, nn.RNNBase)
        modules[name].children = [
            names[id(child)] for child in module.children() if id(child) in names
        ]
    state = [
        *model.named_parameters(remove_duplicate=False),
        *model.named_buffers(remove_duplicate=False),
    ]
    state_names: dict[int, str] = {}
    for state_name, tensor in state:
        state_names.setdefault(tensor.untyped_storage().data_ptr(), state_name)
    recorder = _Recorder(backend, state_names)
    saved_by: dict[int, set[tuple[str, ...]]] = {}
    lazy = backend.is_lazy
    started: dict[str, float] = {}

    def before(module: nn.Module, args: Any, kwargs: Any) -> None:
        record = modules[names[id(module)]]
        record.calls += 1
        tensors = tensors_of((args, kwargs))
        # `f(x, x)`: the checkpoint restores such repeats in its recomputation (torch hands
        # it one tensor per argument; self-attention projects `query is key` in one
        # product), so these modules are candidates like any other.
        record.repeated_input |= len({id(t) for t in tensors}) < len(tensors)
        if module.training and getattr(module, "track_running_stats", False):
            for running in (record, *recorder.stack):
                running.running_stats = True
        for tensor in tensors:
            index = recorder.identify(tensor)
            record.data_dependent |= index in recorder.shaped_by_data
            record.input_order.append(index)
            if index is not None:
                record.inputs.add(index)
        if lazy:
            backend.mark_step()
            backend.synchronize()
            started[record.name] = _clock.now()
        recorder.stack.append(record)

    def after(module: nn.Module, args: Any, output: Any) -> None:
        record = recorder.stack.pop()
        if lazy:
            backend.mark_step()
            backend.synchronize()
            record.forward_time += _clock.now() - started.pop(record.name)

    def pack(tensor: torch.Tensor) -> None:
        index = recorder.identify(tensor)
        if index is not None:
            saved_by.setdefault(index, set()).add(tuple(m.name for m in recorder.stack))
        geometry = Geometry.of(tensor)
        for record in recorder.stack:
            record.packs.append((index, geometry))

    with untouched(model, backend):
        timed_forward(model, example_inputs, backend)  # warm-up: first-call costs not kept
        forward_time = min(timed_forward(model, example_inputs, backend) for _ in range(2))
        with ExitStack() as stack:
            for module in model.modules():
                stack.callback(module.register_forward_pre_hook(before, with_kwargs=True).remove)
                stack.callback(module.register_forward_hook(after).remove)
            stack.enter_context(recorder)
            stack.enter_context(dropping_saved(pack))
            output = call_model(model, example_inputs)
        backend.mark_step()
        require_grad(output)
        # What a plain forward would leave alive: the storages it creates that autograd
        # saves, and those still alive here without them (the output, module caches).
        held = {index for index in recorder.created if index in saved_by}
        held.update(recorder.created - recorder.freed)
        plain_live = sum(recorder.storage_bytes[index] for index in held)
        del output
        noise = 0.0 if lazy else recorder.time_again(model, example_inputs)
    if lazy:
        for record in modules.values():
            share = record.recomputed_bytes / max(record.written_bytes, 1)
            record.recomputed_time = record.forward_time * share
            for call in record.ops:
                written = sum(recorder.storage_bytes[index] for index in call.fresh)
                call.seconds = record.forward_time * written / max(record.written_bytes, 1)
    _share_timings(modules, recorder.storage_bytes)
    if not lazy:
        # Operators timed alone miss the Python between them, which recomputation pays too.
        scale = forward_time / recorder.operator_time if recorder.operator_time > 0 else 1.0
        for record in modules.values():
            record.forward_time = scale * sum(call.seconds for call in record.ops)
            record.recomputed_time = scale * sum(
                call.seconds for call in record.ops if not is_saved_operator(call.func)
            )
    return StepProfile(
        modules=modules,
        storage_bytes=recorder.storage_bytes,
        saved_by=saved_by,
        step_time=math.nan,
        forward_time=forward_time,
        plain_live_bytes=plain_live,
        noise=noise,
    )
