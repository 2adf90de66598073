"""Saved-tensor grain: drop single activations, recompute them from what stays saved.

A checkpoint (whole module or selective) re-runs the module's forward in backward, and
a selective policy pays Python for every operator call twice; on a host CPU that alone
costs about a tenth of a transformer step. Many activations, though, are one cheap
operator away from activations autograd keeps anyway: the output of dropout is
``relu_out * mask`` and both factors are saved; a layer norm's output comes from its
saved input. This grain works on the saved tensors themselves, through saved-tensor
hooks around the module's forward, with no dispatch mode:

* *dropped*: a saved tensor whose producing calls can run again (:func:`._replay.
  replayable`) from tensors that stay reachable (the module's inputs, parameters and
  buffers, saved tensors that are kept) is not stored; in backward those calls run
  again, bit for bit the same;
* *packed*: a dropout mask on the host is a float tensor of two values (0 and
  ``1/(1-p)``); it is stored as booleans and its nonzero value, a quarter of the bytes,
  and rebuilt exactly. The forward checks that the tensor has two such values and
  keeps it whole otherwise.

:func:`saved_units` builds the units from the profile, orders them greedily by
recompute seconds per byte saved (O(U log U) for U units, with O(U) checks each that
no chosen recipe reads a dropped tensor) and returns every prefix; each becomes one
option of the planner. :func:`saved_plan` turns the chosen prefix into a
:class:`SavedPlan`, which :class:`._saved_wrapper.SavedTensorWrapper` carries out.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from torch.utils._pytree import tree_leaves

from .._replay import Geometry, Ref, counted, operator_label
from .._saved_plan import DROP, LEAF, PACK, ReplayStep, SavedPlan
from ._records import ModuleProfile, OpCall, StepProfile

__all__ = [
    "SavedUnit",
    "saved_plan",
    "saved_summary",
    "saved_units",
]

_DEPTH = 8  # unsaved intermediates a recipe may recompute on its way to a saved tensor


@dataclass
class SavedUnit:
    """Storages dropped or packed together, what that saves and what it costs."""

    action: str
    storages: frozenset[int]
    saved_bytes: int
    seconds: float
    steps: tuple[OpCall, ...] = ()  # the recorded calls to run again, in order
    leaves: frozenset[int] = frozenset()  # kept saved tensors its recipe reads
    inputs: frozenset[int] = frozenset()  # module inputs its recipe reads
    label: str = ""


def _refs(template: Any) -> Iterator[Ref]:
    return (leaf for leaf in tree_leaves(template) if isinstance(leaf, Ref))


class _Module:
    """One module's calls and saved tensors, indexed for building recipes."""

    def __init__(self, profile: StepProfile, record: ModuleProfile) -> None:
        self.profile = profile
        self.record = record
        self.prefix = f"{record.module}."
        self.producer: dict[int, OpCall] = {}
        self.position: dict[int, int] = {}  # id of a call -> its place in the forward
        self.last_write: dict[int, int] = {}  # storage -> place of its last in-place write
        for place, call in enumerate(record.ops):
            self.position[id(call)] = place
            for index in call.mutated:
                self.last_write[index] = place
            for index in call.fresh:
                self.producer.setdefault(index, call)
        self.saved = {index for index, _ in record.packs if index is not None}
        self.owned = {
            index
            for index in self.saved
            if all(record.name in stack for stack in profile.saved_by.get(index, ()))
        }
        self.inputs: dict[int, int] = {}  # input storage -> its first position
        for position, storage in enumerate(record.input_order):
            if storage is not None:
                self.inputs.setdefault(storage, position)

    def recipe(
        self, index: int, dropped: frozenset[int] = frozenset(), depth: int = 0
    ) -> tuple[list[OpCall], set[int], set[int]] | None:
        """The calls that recompute storage ``index``; the saved storages and inputs they read.

        Saved storages in ``dropped`` are recomputed on the way, like unsaved ones.
        """
        call = self.producer.get(index)
        if call is None or call.template is None or index in self.last_write:
            return None  # a storage written in place after its creation: replay differs
        place = self.position[id(call)]
        calls: list[OpCall] = []
        leaves: set[int] = set()
        inputs: set[int] = set()
        for ref in _refs(call.template):
            if ref.kind == "state":
                if not str(ref.key).startswith(self.prefix):
                    return None
                continue
            key = int(ref.key)
            if self.last_write.get(key, -1) > place:
                return None  # written in place after this call read it
            if key in self.inputs:
                inputs.add(key)
                continue
            if key in self.saved and key not in dropped:
                leaves.add(key)
                continue
            if depth >= _DEPTH:
                return None
            found = self.recipe(key, dropped, depth + 1)
            if found is None:
                return None
            calls.extend(c for c in found[0] if all(c is not other for other in calls))
            leaves |= found[1]
            inputs |= found[2]
        calls.append(call)
        return calls, leaves, inputs

    def drop_unit(self, index: int, dropped: frozenset[int] = frozenset()) -> SavedUnit | None:
        """Dropping the saved outputs of the call that made ``index``, if they can be."""
        call = self.producer.get(index)
        found = None if call is None else self.recipe(index, dropped)
        if call is None or found is None:
            return None
        calls, leaves, inputs = found
        storages = frozenset(i for i in call.fresh if i in self.owned)
        if storages & leaves:
            return None
        return SavedUnit(
            DROP,
            storages,
            sum(self.profile.storage_bytes[i] for i in storages),
            sum(c.seconds + self.profile.rates.replay_seconds for c in calls),
            tuple(calls),
            frozenset(leaves),
            frozenset(inputs),
            operator_label(call.name),
        )

    def drop_units(self) -> list[SavedUnit]:
        units: dict[int, SavedUnit] = {}
        for index in sorted(self.owned):
            call = self.producer.get(index)
            unit = None if call is None or id(call) in units else self.drop_unit(index)
            if call is not None and unit is not None:
                units[id(call)] = unit
        return list(units.values())

    def pack_units(self) -> list[SavedUnit]:
        units: list[SavedUnit] = []
        if not self.profile.host_masks:
            return units  # a device's dropout draws its mask in kernels of its own
        for index in sorted(self.owned):
            geometries = [g for i, g in self.record.packs if i == index]
            if not geometries or not geometries[0].dtype.is_floating_point:
                continue
            writers = [c for c in self.record.ops if index in c.mutated]
            if not any(c.random for c in writers):
                continue
            itemsize = geometries[0].dtype.itemsize
            size = self.profile.storage_bytes[index]
            rates = self.profile.rates
            seconds = size / rates.pack_bytes + 2 * rates.hook_seconds
            units.append(
                SavedUnit(PACK, frozenset({index}), size - size // itemsize, seconds, label="mask")
            )
        return units


def saved_units(profile: StepProfile, name: str) -> list[list[SavedUnit]]:
    """Greedy prefixes of module ``name``'s drop and pack units (see the module docstring)."""
    module = _Module(profile, profile.modules[name])
    units = module.drop_units() + module.pack_units()
    units.sort(key=lambda unit: unit.seconds / max(unit.saved_bytes, 1))
    chosen: list[SavedUnit] = []
    dropped: set[int] = set()
    pinned: set[int] = set()
    prefixes = []
    for first in units:
        unit: SavedUnit | None = first
        if first.action == DROP and first.leaves & dropped:
            # Its recipe now goes through tensors dropped before it: recompute those too.
            unit = module.drop_unit(min(first.storages), frozenset(dropped))
        if unit is None or unit.saved_bytes <= 0:
            continue
        if unit.action == DROP and unit.storages & pinned:
            continue
        chosen.append(unit)
        if unit.action == DROP:
            dropped |= unit.storages
            pinned |= unit.leaves
        prefixes.append(list(chosen))
    return prefixes


def saved_summary(units: list[SavedUnit]) -> str:
    """``saved: mul x2, masks packed``: what a prefix of units drops and packs."""
    return "saved: " + counted(
        unit.label if unit.action == DROP else "masks packed" for unit in units
    )


def saved_plan(profile: StepProfile, name: str, units: list[SavedUnit]) -> SavedPlan:
    """The :class:`SavedPlan` that carries out ``units`` in module ``name``."""
    record = profile.modules[name]
    module = _Module(profile, record)
    action: dict[int, str] = {}
    recipes: dict[int, tuple[ReplayStep, ...]] = {}
    for unit in units:
        for index in unit.storages:
            action[index] = unit.action
            if unit.action == DROP:
                recipes[index] = tuple(
                    ReplayStep(step.name, step.func, step.template, step.outputs)
                    for step in unit.steps
                )
        for index in unit.leaves:
            action.setdefault(index, LEAF)
    positions: dict[int, tuple[str, int]] = {}
    geometries: dict[int, Geometry] = {}
    for position, (storage, geometry) in enumerate(record.packs):
        if storage is not None and storage in action:
            positions[position] = (action[storage], storage)
            geometries[position] = geometry
    needed = {
        int(ref.key)
        for steps in recipes.values()
        for step in steps
        for ref in _refs(step.template)
        if ref.kind == "storage"
    }
    return SavedPlan(
        module=record.module,
        positions=positions,
        geometries=geometries,
        recipes=recipes,
        inputs={i: p for i, p in module.inputs.items() if i in needed},
        summary=saved_summary(units),
        grads=record.grads,
        input_shapes=record.input_shapes,
    )
