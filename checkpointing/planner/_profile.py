"""Profiling one training step for the planner: on fake tensors, with no rate in it.

The step runs on *fake tensors* (``torch._subclasses.FakeTensorMode``): every
parameter, buffer and input is replaced by a tensor that has a shape, a dtype and a
device but no memory, and the model is called through ``torch.func.functional_call``
so the real parameters are never touched. Planning therefore holds none of the
activations the budget is for and draws no random numbers, on any backend. One real
forward without grad, which autograd saves nothing for, runs first: the fake step makes
each module call as it did (an argument it passed as ``None`` stays ``None``), and each
call's inputs are checked against it afterwards (:mod:`._real_calls`); on a lazy device
it is not run, so nothing is traced or compiled there.

A dispatch mode and saved-tensor hooks record, per module *call*: the storages autograd
saves while it runs (each once, parameters and buffers excluded, as
:class:`SavedTensorMeter` counts), the storages of its tensor inputs (what a checkpoint
keeps instead), the outputs of the operators a selective checkpoint keeps, and every
operator call with what it computes and moves (:func:`._work.op_work`: FLOPs by class,
bytes, random draws). Backward runs on the fake tensors too, and its operator calls are
recorded for the plain step's time. Nothing here depends on the device's speed: the
cost pass (:func:`._pricing.cost`) prices the recorded step at rates, as often as asked.

A module called once is recorded under its qualified name; a module called several
times per step (a layer shared across depths) gets one record per call, named
``"name@k"`` for its k-th call, each planned on its own.

Where the model cannot run on fake tensors (an operator whose output shape the data
decides, such as mixture-of-experts routing, or one without a fake kernel), one real
forward runs instead, keeping what autograd saves only until the module call that saved
it returns (:class:`.._steps.SavedPerCall`); its backward is then estimated from its forward's
calls (:func:`._pricing.backward_seconds`). :attr:`StepProfile.fallback` says why.
"""

from __future__ import annotations

import weakref
from collections import Counter
from contextlib import ExitStack, nullcontext
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from accel._compat import fake_profile_unavailable

from .._measure import storage_key
from .._replay import Geometry, Ref, replay_arguments, template_of
from .._saved_plan import grad_pattern
from .._selective import is_saved_operator, written_tensors
from .._steps import SavedPerCall, call_model, require_grad, tensors_of, untouched
from ._data_shapes import decides_shape
from ._kernels import device_kernels
from ._layouts import DeviceLayouts
from ._leftovers import keeping_saved, leaving_nothing, tracking
from ._real_calls import RealCalls, real_calls, unlike_real
from ._records import ModuleProfile, OpCall, RecordedStep, call_name
from ._sharded import refuse_real_step, runs_collectives, unsharded, unsharded_fake
from ._signature import inputs_of, structure_of
from ._work import OpWork, op_work

__all__ = ["call_with_state", "fake_state", "grads_of", "profile_step"]


class _Recorder(TorchDispatchMode):
    """Gives every new storage an index, and charges operators to the running calls."""

    def __init__(self, state_names: dict[int, str]) -> None:
        super().__init__()
        self.state_names = state_names
        # Storage key -> its index and the storage, held weakly to see when it dies.
        self.ids: dict[int, tuple[int, weakref.ref[Any]]] = {}
        self.storage_bytes: dict[int, int] = {}
        self.stack: list[ModuleProfile] = []
        self.occurrences: Counter[tuple[int, str]] = Counter()  # (record, operator) calls
        self.shaped_by_data: set[int] = set()  # storages created downstream of routing
        self.forward: list[OpWork] = []  # every operator call, in order
        self.backward: list[OpWork] = []
        self.in_backward = False

    def identify(self, tensor: torch.Tensor, new: bool = False) -> int | None:
        key = storage_key(tensor)
        if key in self.state_names:
            return None
        storage = tensor.untyped_storage()
        known = self.ids.get(key)
        # A storage's address is reused once it is freed (the real-forward profile frees
        # what each call saved), and a tensor no operator returned (a wrapped scalar) may
        # land there: it is a new storage, or the numbering would follow the allocator.
        if not new and known is not None and known[1]() is storage:
            return known[0]
        index = len(self.storage_bytes)
        self.storage_bytes[index] = storage.nbytes()
        self.ids[key] = (index, weakref.ref(storage))
        return index

    def ref(self, tensor: torch.Tensor) -> Ref | None:
        """Where ``tensor`` came from: a parameter or buffer by name, else its storage."""
        name = self.state_names.get(storage_key(tensor))
        if name is not None:
            return Ref("state", name, Geometry.of(tensor))
        index = self.identify(tensor)
        return None if index is None else Ref("storage", index, Geometry.of(tensor))

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        arguments = tensors_of((args, kwargs))
        inputs = {storage_key(t) for t in arguments}
        results = tensors_of(out)
        fresh_keys = {storage_key(t): t for t in results if storage_key(t) not in inputs}
        fresh_bytes = sum(t.untyped_storage().nbytes() for t in fresh_keys.values())
        work = op_work(func, args, kwargs, out, fresh_bytes)
        if self.in_backward:
            self.backward.append(work)
            return out
        self.forward.append(work)
        outputs = tuple(
            None if storage_key(t) in inputs else self.identify(t, new=True) for t in results
        )
        fresh = [index for index in outputs if index is not None]
        read = [index for t in arguments if (index := self.identify(t)) is not None]
        mutated = [
            index
            for t in written_tensors(func, args, kwargs)
            if (index := self.identify(t)) is not None
        ]
        kept = is_saved_operator(func)
        name, random = work.operator, work.random
        data_dependent = decides_shape(func, args, kwargs)
        if data_dependent or self.shaped_by_data.intersection(read):
            # The output's shape may follow the data too, unless an input whose shape
            # does not already has that shape (a residual add, an index_add_ target).
            steady = {
                tuple(t.shape)
                for t in arguments
                if storage_key(t) not in self.state_names
                and self.identify(t) not in self.shaped_by_data
            }
            for index, tensor in zip(outputs, results, strict=False):
                if index is not None and (data_dependent or tuple(tensor.shape) not in steady):
                    self.shaped_by_data.add(index)
        template = None
        replay = replay_arguments(func, args, kwargs) if self.stack else None
        if replay is not None:
            template, complete = template_of(replay, self.ref)
            template = template if complete else None
        for record in self.stack:
            record.data_dependent |= data_dependent
            if kept:
                record.cached.update(fresh)
            occurrence = self.occurrences[id(record), name]
            self.occurrences[id(record), name] += 1
            record.ops.append(
                OpCall(
                    name,
                    occurrence,
                    0.0,
                    tuple(fresh),
                    tuple(dict.fromkeys(mutated)),
                    tuple(dict.fromkeys(read)),
                    random,
                    func,
                    template,
                    outputs,
                    work,
                    kept,
                )
            )
        return out


_UNSET = object()


class _Calls:
    """Module hooks that open one record per module call and track the call tree."""

    def __init__(
        self, model: nn.Module, recorder: _Recorder, real: RealCalls | None = None
    ) -> None:
        self.real = real
        self.names = {id(module): name for name, module in model.named_modules()}
        self.recorder = recorder
        self.records: list[ModuleProfile] = []
        self.children: dict[int, list[ModuleProfile]] = {}
        self.counts: Counter[str] = Counter()
        self.saved_by: dict[int, set[tuple[int, ...]]] = {}
        self.saved = SavedPerCall(self.pack)  # the real forward's saved-tensor hooks
        self.attributes: list[dict[str, Any]] = []  # each running call's module's, before

    def before(
        self, module: nn.Module, args: Any, kwargs: Any
    ) -> tuple[Any, dict[str, Any]] | None:
        recorder = self.recorder
        name = self.names[id(module)]
        aligned: tuple[str, ...] = ()
        if self.real is not None:
            args, kwargs, aligned = self.real.align(name, self.counts[name], args, kwargs)
        record = ModuleProfile(
            name,
            kind=type(module).__qualname__,
            module=name,
            call=self.counts[name],
            fused_rnn=isinstance(module, nn.RNNBase),
            child_kinds=tuple(type(child).__qualname__ for child in module.children()),
            aligned=aligned,
        )
        self.counts[name] += 1
        self.records.append(record)
        if recorder.stack:
            self.children.setdefault(id(recorder.stack[-1]), []).append(record)
        tensors = tensors_of((args, kwargs))
        if module.training and getattr(module, "track_running_stats", False):
            for running in (record, *recorder.stack):
                running.running_stats = True
        record.grads = grad_pattern(module, tensors)
        record.input_shapes = tuple(tuple(tensor.shape) for tensor in tensors)
        for tensor in tensors:
            index = recorder.identify(tensor)
            record.data_dependent |= index in recorder.shaped_by_data
            record.input_order.append(index)
            if index is not None:
                record.inputs.add(index)
        recorder.stack.append(record)
        self.attributes.append(dict(module.__dict__))
        self.saved.enter()
        return (args, kwargs) if aligned else None

    def after(self, module: nn.Module, args: Any, output: Any) -> None:
        record = self.recorder.stack.pop()
        before = self.attributes.pop()
        # What the forward rebound on its module (a recurrent state kept for generation):
        # under torch.compile, dynamo refuses that inside a checkpointed region.
        record.assigns = tuple(
            name
            for name, value in module.__dict__.items()
            if not name.startswith("_") and before.get(name, _UNSET) is not value
        )
        self.saved.leave()

    def pack(self, tensor: torch.Tensor) -> None:
        recorder = self.recorder
        index = recorder.identify(tensor)
        if index is not None:
            self.saved_by.setdefault(index, set()).add(tuple(id(m) for m in recorder.stack))
        geometry = Geometry.of(tensor)
        for record in recorder.stack:
            record.packs.append((index, geometry))

    def finish(self) -> tuple[dict[str, ModuleProfile], dict[int, set[tuple[str, ...]]]]:
        """The records by name (``"name@k"`` for repeated calls) and ``saved_by`` by name."""
        for record in self.records:
            record.calls = self.counts[record.module]
            record.name = call_name(record.module, record.call, record.calls)
        for record in self.records:
            record.children = [child.name for child in self.children.get(id(record), [])]
        by_id = {id(record): record.name for record in self.records}
        saved_by = {
            index: {tuple(by_id[i] for i in stack) for stack in stacks}
            for index, stacks in self.saved_by.items()
        }
        return {record.name: record for record in self.records}, saved_by


def fake_state(model: nn.Module, mode: Any) -> dict[str, torch.Tensor]:
    """Every parameter and buffer as a fake tensor (shared ones shared), by name.

    Each module's tensors are named at its first path only. A module registered at two
    paths (one layer in a stage and called again after it) would otherwise be swapped
    twice by :func:`call_with_state`, the second swap saving the first one's fake tensor
    as the module's own, and the model would keep fakes after the call. A tensor shared
    by two modules (a head tied to its embedding) is named under both.
    """
    fakes: dict[int, torch.Tensor] = {}
    state: dict[str, torch.Tensor] = {}
    named = [
        named
        for prefix, module in model.named_modules()
        for named in (
            *module.named_parameters(prefix=prefix, recurse=False),
            *module.named_buffers(prefix=prefix, recurse=False),
        )
    ]
    for name, tensor in named:
        if id(tensor) not in fakes:
            fake = unsharded_fake(mode, tensor)
            if fake is None:
                fake = mode.from_tensor(tensor)
            if isinstance(tensor, nn.Parameter) and tensor.requires_grad:
                fake = fake.detach().requires_grad_(True)
            fakes[id(tensor)] = fake
        state[name] = fakes[id(tensor)]
    return state


def _run(
    model: nn.Module,
    example_inputs: Any,
    fake: bool,
    backend: Any,
    real: RealCalls | None = None,
) -> tuple[_Calls, _Recorder]:
    """One step under the recorder: fake (forward and backward) or real (forward only).

    The fake step runs attention through the kernel the backend's device would choose
    (:mod:`._kernels`), and calls each module as ``real`` (a real forward's calls, where
    one ran) did; the real one runs on the device, which chooses for itself.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    # Real tensors the model keeps outside its parameters and buffers (an index a real
    # step left in a cache) are read as constants; the profile never writes to them.
    mode: Any = FakeTensorMode(allow_non_fake_inputs=True) if fake else None
    state: dict[str, torch.Tensor] = {}
    inputs = example_inputs
    if fake:
        with mode:
            state = fake_state(model, mode)
            inputs = torch.utils._pytree.tree_map(
                lambda t: mode.from_tensor(t) if isinstance(t, torch.Tensor) else t,
                example_inputs,
            )
        names = {storage_key(tensor): name for name, tensor in state.items()}
    else:
        named = [
            *model.named_parameters(remove_duplicate=False),
            *model.named_buffers(remove_duplicate=False),
        ]
        names = {}
        for name, tensor in named:
            names.setdefault(storage_key(tensor), name)
    recorder = _Recorder(names)
    calls = _Calls(model, recorder, real)
    with ExitStack() as stack:
        for module in model.modules():
            stack.callback(module.register_forward_pre_hook(calls.before, with_kwargs=True).remove)
            stack.callback(module.register_forward_hook(calls.after).remove)
        stack.enter_context(mode if fake else nullcontext())
        stack.enter_context(device_kernels(backend) if fake else nullcontext())
        stack.enter_context(DeviceLayouts() if fake else nullcontext())
        stack.enter_context(tracking())
        stack.enter_context(recorder)
        if fake:
            with keeping_saved(calls.pack):
                output = call_with_state(model, state, inputs)
            outputs = require_grad(output)
            recorder.in_backward = True
            torch.autograd.backward(outputs, [torch.ones_like(t) for t in outputs])
        else:
            with calls.saved.hooks():
                output = call_model(model, inputs)
            require_grad(output)
        del output
    return calls, recorder


def call_with_state(model: nn.Module, state: dict[str, torch.Tensor], inputs: Any) -> Any:
    """``model`` called on ``inputs`` with :func:`fake_state`'s tensors in place of its own.

    Every tied name is in ``state`` already, so nothing is tied again: a second tie would
    swap a module reached at two paths twice.
    """
    from torch.func import functional_call

    if isinstance(inputs, dict):
        return functional_call(model, state, (), inputs, tie_weights=False, strict=False)
    return functional_call(model, state, tuple(inputs), tie_weights=False, strict=False)


def profile_step(model: nn.Module, example_inputs: Any, backend: Any) -> RecordedStep:
    """Record one plain step of ``model(*example_inputs)`` (see the module docstring).

    Args:
        model: The model, not yet checkpointed.
        example_inputs: A tuple of positional arguments or a dict of keyword arguments.
        backend: The backend the model runs on: it names the attention kernel of its
            device (:func:`accel.attention_kernel`), and the real-tensor fallback puts its
            generators and the model's buffers back afterwards.

    Returns:
        The recorded step, to price with :func:`._pricing.cost`.
    """
    fallback = fake_profile_unavailable() or _no_fake_reason(model)
    real = None
    if not fallback and _checkable(model, example_inputs, backend):
        real = real_calls(model, example_inputs, backend)
    if not fallback:
        # Outside the handler: a failed step's frames are gone before its leftovers are.
        with leaving_nothing(model), unsharded(model):
            try:
                calls, recorder = _run(model, example_inputs, True, backend, real)
            except ValueError:
                raise
            except Exception as error:
                first = str(error).splitlines()[0][:160] if str(error) else ""
                fallback = (
                    f"the model could not run on fake tensors ({type(error).__name__}: {first})"
                )
    if fallback:
        refuse_real_step(model, fallback)
        fallback += (
            ", so one real forward was profiled, keeping what each module call saved "
            "only until it returned, and backward was estimated from the forward's operators"
        )
        with untouched(model, backend), leaving_nothing(model, fake=False):
            calls, recorder = _run(model, example_inputs, False, backend)
    modules, saved_by = calls.finish()
    if not fallback and real is not None:
        unlike_real(modules, real.shapes())
    host = _host_device(model, example_inputs)
    return RecordedStep(
        modules=modules,
        storage_bytes=recorder.storage_bytes,
        saved_by=saved_by,
        forward=tuple(recorder.forward),
        backward=() if fallback else tuple(recorder.backward),
        fallback=fallback,
        host_masks=host,
        structure=structure_of(model),
        inputs=inputs_of(example_inputs),
        grads=grads_of(model, example_inputs),
        device_type=backend.device_type,
    )


def grads_of(model: nn.Module, example_inputs: Any) -> tuple[bool, ...]:
    """Whether each parameter, then each tensor input, requires grad."""
    tensors = (*model.parameters(), *tensors_of(example_inputs))
    return tuple(tensor.requires_grad for tensor in tensors)


def _no_fake_reason(model: nn.Module) -> str:
    """Why fake tensors would misjudge ``model``'s memory, or empty."""
    for name, module in model.named_modules():
        if isinstance(module, nn.RNNBase):
            return (
                f"{name or 'the model'} is an {type(module).__name__}, whose fused kernel "
                "keeps a workspace for backward that fake tensors give no size"
            )
    return ""


def _checkable(model: nn.Module, example_inputs: Any, backend: Any) -> bool:
    """Whether a real forward may check the fake step's calls (:mod:`._real_calls`).

    Not on a lazy device (it would trace and compile a graph), not for a profile made
    for another device (the model's tensors on the host, the backend an accelerator's),
    and not for a model whose forward runs collectives (planned on rank 0 alone).
    """
    if backend.is_lazy or runs_collectives(model):
        return False
    tensors = (*model.parameters(), *model.buffers(), *tensors_of(example_inputs))
    return all(tensor.device.type == backend.device_type for tensor in tensors)


def _host_device(model: nn.Module, example_inputs: Any) -> bool:
    """Whether the model's tensors live in host memory (where dropout masks are floats)."""
    for tensor in (*model.parameters(), *tensors_of(example_inputs)):
        return tensor.device.type == "cpu"
    return True
