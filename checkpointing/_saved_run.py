"""One forward under a :class:`._saved_plan.SavedPlan`: its saved tensors, by position.

:class:`SavedRun` holds what the hooks of :class:`._saved_wrapper.SavedTensorWrapper`
pack in one forward of the module and gives it back in backward: kept, packed, or
recomputed from the plan's recipes (:meth:`SavedRun.unpack`). :class:`PlanIndex` holds
what every forward under a plan reads, worked out once per wrapper.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import torch
from torch import nn

from accel._compat import current_saved_tensors_hooks

from ._errors import CheckpointError, plan_mismatch
from ._measure import storage_key
from ._packed import Packed
from ._replay import Geometry, Ref, flat_template, resolve_flat
from ._saved_plan import DROP, LEAF, PACK, SavedPlan
from ._steps import tensors_of as _tensors

__all__ = ["PlanIndex", "SavedRun"]


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
        self, run: SavedRun, index: int, geometry: Geometry, kept: torch.Tensor | None = None
    ) -> None:
        self.run = run
        self.index = index
        self.geometry = geometry
        self.kept = kept


class PlanIndex:
    """What every forward under one :class:`SavedPlan` reads, worked out once."""

    def __init__(self, plan: SavedPlan) -> None:
        self.plan = plan
        # How many planned positions save each dropped storage (each unpacks it once).
        self.unpacks: dict[int, int] = {}
        for action, index in plan.positions.values():
            if action == DROP:
                self.unpacks[index] = self.unpacks.get(index, 0) + 1
        # Each recipe step's arguments, flattened once: a recipe runs every backward.
        self.flat = {
            id(step): flat_template(step.template)
            for steps in plan.recipes.values()
            for step in steps
        }

    def __deepcopy__(self, memo: dict[int, Any]) -> PlanIndex:
        # Worked out again from the copied plan: ``flat`` is keyed by its steps' ids,
        # which a copy changes (a deep-copied planned model, an EMA copy, failed its
        # first backward), and its flattened structures are pytree specs, whose copying
        # torch 2.13 deprecates with a warning.
        return PlanIndex(copy.deepcopy(self.plan, memo))


class SavedRun:
    """One forward of the wrapped module: its saved tensors counted by position."""

    def __init__(
        self,
        planned: PlanIndex,
        module: nn.Module,
        inputs: list[torch.Tensor],
        checking: bool = False,
    ) -> None:
        self.plan = planned.plan
        self.planned = planned
        self.checking = checking
        self.held: list[tuple[int, _Dropped]] = []  # a checked call's dropped tensors
        self.problem = ""  # why a checked call's saved tensors do not match the plan
        self.module = module
        self.position = 0
        self.leaves: dict[int, torch.Tensor | Packed] = {}
        self.versions: dict[int, int] = {}
        self.pointers: dict[int, int] = {}
        # A dropped storage saved at several positions is recomputed once: it waits
        # here, as do dropped storages its recipe computed on the way, until their
        # last planned unpack (``pending``).
        self.cache: dict[int, torch.Tensor] = {}
        self.pending = dict(planned.unpacks)
        self.devices: set[str] | None = None
        self.states: dict[Ref, torch.Tensor] = {}  # parameters and buffers a recipe reads
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
            packed = Packed.of(tensor, check=self.checking) if earlier is None else earlier
            if isinstance(packed, Packed) and packed.geometry == geometry:
                self._remember(index, packed)
                return packed
            if self.checking and earlier is None:
                # Later calls pack this position unchecked: it must be a mask now.
                self.problem = f"saved tensor {position} is not a dropout mask of two values"
                return self._outer_pack(tensor)
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
        self.pending = dict(self.planned.unpacks)
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
        left = self.pending.get(index, 0) - 1
        self.pending[index] = left
        cached = self.cache.get(index)
        if cached is not None:
            if left <= 0:
                del self.cache[index]
            return cached
        computed: dict[int, torch.Tensor] = {}
        steps = self.plan.recipes[index]

        def lookup(ref: Ref) -> torch.Tensor:
            if ref.kind == "state":
                state = self.states.get(ref)
                if state is None:
                    name = str(ref.key)[len(self.plan.state_prefix) :]
                    owner, _, attribute = name.rpartition(".")
                    module = self.module.get_submodule(owner)
                    state = self.states[ref] = ref.geometry.view(getattr(module, attribute))
                return state
            key = int(ref.key)
            base = computed[key] if key in computed else self._leaf(key)
            return ref.geometry.view(base)

        if self.devices is None:
            self.devices = {
                leaf.device.type for leaf in self.leaves.values() if isinstance(leaf, torch.Tensor)
            }
        with torch.no_grad(), contextlib.ExitStack() as stack:
            for device in self.devices:
                if _autocast_enabled(device):
                    stack.enter_context(torch.autocast(device_type=device, enabled=False))
            for step in steps:
                args, kwargs = resolve_flat(self.planned.flat[id(step)], lookup)
                outputs = _tensors(step.func(*args, **kwargs))
                for storage, output in zip(step.outputs, outputs, strict=False):
                    if storage is not None:
                        computed[storage] = output
        for storage, tensor in computed.items():  # ``index`` too, if unpacked again
            if self.pending.get(storage, 0) > 0:
                self.cache.setdefault(storage, tensor)
        return computed[index]


def _autocast_enabled(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` (a recipe turns it off where it is)."""
    try:
        return bool(torch.is_autocast_enabled(device_type))
    except (RuntimeError, TypeError, ValueError):  # a device type autocast does not know
        return True  # as before: turn it off, whatever the state


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
