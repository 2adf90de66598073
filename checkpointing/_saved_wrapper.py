"""``SavedTensorWrapper``: carries out a :class:`._saved_plan.SavedPlan` on one module.

Around the wrapped module's forward it installs saved-tensor hooks that count the
tensors autograd saves. At a planned position the tensor must be the view the profile
saw (shape, strides, offset, dtype, storage size, and the same storage wherever the
plan says so), since a recipe built for other tensors would not give the forward's
values. Planned tensors are then:

* kept and remembered (``"leaf"``): a recipe reads them in backward; their version
  counters are checked then, as autograd checks its own saved tensors;
* packed (``"pack"``): stored as booleans and one value; a tensor that turns out not
  to be two-valued is kept whole;
* dropped (``"drop"``): unpacking runs the recipe's calls again under ``no_grad`` and
  without autocast, and returns the saved view of the result. Other dropped outputs of
  the same call wait in a cache until their own unpack.

Every other saved tensor goes to the hooks that were active outside the module, if
any, unchanged. Under ``torch.compile``, where saved-tensor hooks cannot be traced, the
module runs as its plan's compiled form (``SavedPlan.compiled_as``: a whole or
selective checkpointed region, which the compiler honours, or the module as it is),
which the planner chose so that the plan's estimated bytes still hold.

The plan was made on a fake-tensor step, and a device's kernels may lay out or save
tensors otherwise than their fake counterparts. So the first call with inputs of the
planned shapes (and each later one whose inputs have other strides) is *checked*: every
tensor it would drop is kept meanwhile, and at the end of its forward each recipe runs
and its result is compared, bit for bit, with the tensor autograd saved. If every saved
tensor matched the plan and every recipe gave the saved values, the kept tensors are
released and the plan holds for such calls. Otherwise this call keeps its tensors (it
is exact, as the plain module) and later such calls are checkpointed whole, with one
warning that says why. The forward runs once either way (running statistics update
once). A call whose inputs have other shapes than the profiled ones raises
:class:`CheckpointError` at the first saved tensor that differs, with the generators put
back: the plan was made for other inputs.

Which tensors autograd saves depends on which inputs and parameters need grad (a
linear layer saves its weight only when its input needs grad). A call whose pattern
differs from the profiled one (inputs that need grad where the example inputs did not,
parameters frozen after planning) is checkpointed whole instead, with one warning per
wrapper: exact, and keeping less than the plan would.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import torch
from torch import nn

import accel
from accel import Accelerator
from accel._compat import current_saved_tensors_hooks

from ._caches import refuse_cache_arguments
from ._checkpoint import _user_stacklevel, run_checkpoint
from ._decisions import KEEP, SELECTIVE
from ._errors import CheckpointError, plan_mismatch
from ._measure import storage_key
from ._packed import Packed
from ._replay import Geometry, Ref, resolve
from ._saved_plan import DROP, LEAF, PACK, SavedPlan, grad_pattern
from ._selective import operator_class_contexts
from ._state import ForwardState
from ._steps import tensors_of as _tensors
from ._wrapper import CheckpointWrapper

__all__ = ["SavedTensorWrapper"]


class _Outer:
    """What the hooks active outside the module packed, and their unpack hook."""

    def __init__(self, unpack: Any, value: Any) -> None:
        self.unpack = unpack
        self.value = value


class _Dropped:
    """A dropped saved tensor: which storage, and the view autograd saved of it.

    On a checked call it keeps the tensor itself (``kept``) until its recipe has given
    the same values.
    """

    def __init__(
        self, run: _Run, index: int, geometry: Geometry, kept: torch.Tensor | None = None
    ) -> None:
        self.run = run
        self.index = index
        self.geometry = geometry
        self.kept = kept


class _Run:
    """One forward of the wrapped module: its saved tensors counted by position."""

    def __init__(
        self, wrapper: SavedTensorWrapper, inputs: list[torch.Tensor], checking: bool = False
    ) -> None:
        self.plan = wrapper.plan
        self.checking = checking
        self.held: list[tuple[int, _Dropped]] = []  # a checked call's dropped tensors
        self.problem = ""  # why a checked call's saved tensors do not match the plan
        self.module = wrapper.module
        self.position = 0
        self.leaves: dict[int, torch.Tensor | Packed] = {}
        self.versions: dict[int, int] = {}
        self.pointers: dict[int, int] = {}
        self.cache: dict[int, torch.Tensor] = {}
        for index, position in self.plan.inputs.items():
            if position < len(inputs):
                self._remember(index, inputs[position])
        self.outer = current_saved_tensors_hooks()

    def _remember(self, index: int, tensor: torch.Tensor | Packed) -> None:
        if index in self.leaves:
            return
        self.leaves[index] = tensor
        if isinstance(tensor, torch.Tensor):
            self.versions[index] = tensor._version

    def _mismatch(self, position: int, what: str) -> CheckpointError:
        return plan_mismatch("saved tensors", self.plan.module, f"saved tensor {position} {what}")

    def pack(self, tensor: torch.Tensor) -> Any:
        position = self.position
        self.position += 1
        planned = self.plan.positions.get(position)
        if planned is None or self.problem:
            return self._outer_pack(tensor)
        action, index = planned
        geometry = self.plan.geometries[position]
        if not geometry.matches(tensor):
            if not self.checking:
                raise self._mismatch(position, "has another shape, layout or dtype")
            self.problem = (
                f"saved tensor {position} is {_view(Geometry.of(tensor))} where the plan "
                f"has {_view(geometry)}"
            )
            return self._outer_pack(tensor)
        pointer = storage_key(tensor)
        if self.pointers.setdefault(index, pointer) != pointer:
            if not self.checking:
                raise self._mismatch(position, "lives in another storage than planned")
            self.problem = f"saved tensor {position} lives in another storage than planned"
            return self._outer_pack(tensor)
        if action == LEAF:
            self._remember(index, tensor)
        elif action == PACK:
            earlier = self.leaves.get(index)
            packed = Packed.of(tensor) if earlier is None else earlier
            if isinstance(packed, Packed) and packed.geometry == geometry:
                self._remember(index, packed)
                return packed
            self._remember(index, tensor)
        elif action == DROP:
            dropped = _Dropped(self, index, geometry, tensor if self.checking else None)
            if self.checking:
                self.held.append((position, dropped))
            return dropped
        return self._outer_pack(tensor)

    def _outer_pack(self, tensor: torch.Tensor) -> Any:
        return tensor if self.outer is None else _Outer(self.outer[1], self.outer[0](tensor))

    def unpack(self, packed: Any) -> torch.Tensor:
        if isinstance(packed, _Dropped):
            if packed.kept is not None:
                return packed.kept
            return packed.geometry.view(self._recompute(packed.index))
        if isinstance(packed, Packed):
            return packed.unpack()
        if isinstance(packed, _Outer):
            result: torch.Tensor = packed.unpack(packed.value)
            return result
        tensor: torch.Tensor = packed
        return tensor

    def check(self) -> str:
        """After a checked forward: why the plan does not hold for it, or empty.

        Runs every dropped tensor's recipe and compares its result with the tensor
        autograd saved; releases the saved tensors where all match.
        """
        try:
            for position, dropped in self.held:
                saved = dropped.kept
                if self.problem or saved is None:
                    break
                if not _same(dropped.geometry.view(self._recompute(dropped.index)), saved):
                    self.problem = f"recomputing saved tensor {position} gives other values"
        except Exception as error:  # a recipe that does not run on this call's tensors
            first = str(error).splitlines()[0][:160] if str(error) else ""
            self.problem = f"recomputing its saved tensors failed ({type(error).__name__}: {first})"
        self.cache.clear()
        if not self.problem:
            for _, dropped in self.held:
                dropped.kept = None
        self.held.clear()
        return self.problem

    def _leaf(self, index: int) -> torch.Tensor:
        leaf = self.leaves.get(index)
        if leaf is None:
            raise CheckpointError(
                f"checkpointing: a recipe of {self.plan.module or 'the model'} reads a "
                "tensor its forward never saved; the module no longer matches its plan. "
                "Make a new plan with plan_checkpointing."
            )
        if isinstance(leaf, Packed):
            return leaf.unpack()
        if leaf._version != self.versions[index]:
            raise RuntimeError(
                f"checkpointing: a tensor that {self.plan.module or 'the model'} saved "
                "for backward was modified in place after its forward (version "
                f"{self.versions[index]} then, {leaf._version} now), so the activations "
                "recomputed from it would be wrong. Clone it before modifying it."
            )
        return leaf

    def _recompute(self, index: int) -> torch.Tensor:
        cached = self.cache.pop(index, None)
        if cached is not None:
            return cached
        computed: dict[int, torch.Tensor] = {}
        steps = self.plan.recipes[index]

        def lookup(ref: Ref) -> torch.Tensor:
            if ref.kind == "state":
                owner, _, attribute = str(ref.key)[len(self.plan.state_prefix) :].rpartition(".")
                return ref.geometry.view(getattr(self.module.get_submodule(owner), attribute))
            key = int(ref.key)
            base = computed[key] if key in computed else self._leaf(key)
            return ref.geometry.view(base)

        devices = {
            leaf.device.type for leaf in self.leaves.values() if isinstance(leaf, torch.Tensor)
        }
        with torch.no_grad(), contextlib.ExitStack() as stack:
            for device in devices:
                stack.enter_context(torch.autocast(device_type=device, enabled=False))
            for step in steps:
                args, kwargs = resolve(step.template, lookup)
                outputs = _tensors(step.func(*args, **kwargs))
                for storage, output in zip(step.outputs, outputs, strict=False):
                    if storage is not None:
                        computed[storage] = output
        last = steps[-1]
        for storage in last.outputs:
            if storage is not None and storage != index and storage in self.plan.recipes:
                self.cache[storage] = computed[storage]
        return computed[index]


def _view(geometry: Geometry) -> str:
    """``(4, 6, 16) float32, strides (96, 1, 6)``: a saved view, for messages."""
    dtype = str(geometry.dtype).removeprefix("torch.")
    return f"{geometry.size} {dtype}, strides {geometry.stride}"


def _same(recomputed: torch.Tensor, saved: torch.Tensor) -> bool:
    """Whether two tensors hold the same values, NaN where the other has NaN."""
    if recomputed.shape != saved.shape or recomputed.dtype != saved.dtype:
        return False
    if recomputed.is_floating_point() or recomputed.is_complex():
        same = (recomputed == saved) | (recomputed.isnan() & saved.isnan())
        return bool(same.all())
    return torch.equal(recomputed, saved)


def _layout(inputs: list[torch.Tensor]) -> tuple[Any, ...]:
    """What a checked call's verdict holds for: its inputs' shapes, strides and dtypes."""
    return tuple((tuple(t.shape), t.stride(), t.storage_offset(), t.dtype) for t in inputs)


class SavedTensorWrapper(CheckpointWrapper):
    """Runs ``module`` with a :class:`SavedPlan`: some saved tensors dropped or packed.

    Built by :meth:`CheckpointPlan.apply` for modules planned at the saved-tensor
    grain; nothing is checkpointed whole, so the forward runs once.
    """

    def __init__(
        self,
        module: nn.Module,
        plan: SavedPlan,
        *,
        backend: Accelerator | None = None,
        preserve_rng_state: bool = True,
    ) -> None:
        super().__init__(module, backend=backend, preserve_rng_state=preserve_rng_state)
        self.plan = plan
        self._warned = False
        self._warned_differs = False
        # Inputs' layout -> "" where a checked call matched the plan, else why not.
        self._verdicts: dict[tuple[Any, ...], str] = {}

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the wrapped module's forward with the plan's saved-tensor hooks.

        Under ``torch.compile`` it runs as the plan's compiled form instead
        (:meth:`_compiled`); around a module dynamo cannot trace (an RNN), as here,
        outside the graph.
        """
        if torch.compiler.is_compiling():
            if not self._traced:
                return self._outside_graph(*args, **kwargs)
            return self._compiled(args, kwargs)
        if not torch.is_grad_enabled():
            return self.module(*args, **kwargs)
        inputs = _tensors((args, kwargs))
        grads = self.plan.grads
        if grads is not None and grad_pattern(self.module, inputs) != grads:
            self._warn_whole()
            return super().forward(*args, **kwargs)
        layout = _layout(inputs)
        verdict = self._verdicts.get(layout)
        if verdict:
            return super().forward(*args, **kwargs)
        shapes = self.plan.input_shapes
        planned = shapes is None or shapes == tuple(tuple(t.shape) for t in inputs)
        return self._hooked(args, kwargs, inputs, layout if verdict is None and planned else None)

    def _compiled(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The module as the plan's compiled form (``plan.compiled_as``).

        Saved-tensor hooks cannot be traced, and without them the compiler keeps whatever
        its partitioner chooses, up to everything the module saves: the form is a
        checkpointed region of the compiled graph, whole or selective, or the module as
        it is where the planner found that its plain saved tensors fit.
        """
        if not torch.is_grad_enabled() or self.plan.compiled_as == KEEP:
            return self.module(*args, **kwargs)
        refuse_cache_arguments(self.module, args, kwargs)
        selective = self.plan.compiled_as == SELECTIVE
        return run_checkpoint(
            self.module,
            args,
            kwargs,
            use_reentrant=False,
            preserve_rng_state=self.preserve_rng_state,
            backend=self._backend_ref.get(),
            context_fn=operator_class_contexts if selective else None,
        )

    def _warn_whole(self) -> None:
        if self._warned:
            return
        self._warned = True
        warnings.warn(
            f"checkpointing: {self.plan.module or 'the model'!r} was planned at the "
            "saved-tensor grain with example inputs whose need for grad differs from this "
            "call's (an input needs grad here, or a parameter was frozen or unfrozen since "
            "planning), so autograd saves other tensors than the plan lists. This call is "
            "checkpointed whole instead: exact, keeping less memory, recomputing more. To "
            "keep the plan, pass plan_checkpointing example inputs that need grad exactly "
            "as the training inputs do.",
            UserWarning,
            stacklevel=_user_stacklevel(),
        )

    # Run eagerly as a whole even inside a compiled caller's eager fallback: were the
    # module's own frames compiled, its saved tensors would not be the planned ones.
    @torch.compiler.disable  # type: ignore[untyped-decorator]
    def _hooked(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        inputs: list[torch.Tensor],
        checked: tuple[Any, ...] | None = None,
    ) -> Any:
        run = _Run(self, inputs, checking=checked is not None)
        state = ForwardState.capture(self._backend_ref.get() or accel.get_backend(), True, inputs)
        try:
            with torch.autograd.graph.saved_tensors_hooks(run.pack, run.unpack):
                output = self.module(*args, **kwargs)
        except CheckpointError:
            state.restore_rng()
            raise
        if checked is not None:
            self._verdicts[checked] = reason = run.check()
            if reason:
                self._warn_differs(reason)
        return output

    def _warn_differs(self, reason: str) -> None:
        if self._warned_differs:
            return
        self._warned_differs = True
        warnings.warn(
            f"checkpointing: {self.plan.module or 'the model'!r} was planned at the "
            "saved-tensor grain on a fake-tensor step, but its real forward on these "
            f"inputs saves other tensors than the plan lists ({reason}): this device lays "
            "out or saves tensors otherwise than the fake profile. Such calls are "
            "checkpointed whole instead: exact, keeping less memory, recomputing more.",
            UserWarning,
            stacklevel=_user_stacklevel(),
        )

    def extra_repr(self) -> str:
        return self.plan.summary
