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
recompute seconds per byte saved (O(U log U) for U units) and returns every prefix;
each becomes one option of the planner. A unit may drop a tensor that the recipe of a
unit chosen before it reads: that recipe is built again to recompute it on the way
(at most O(U) recipes rebuilt per unit). :func:`prefix_seconds` prices a prefix as
its recipes run in backward (:func:`recipe_runs`), so a call two recipes share is
paid once where its result is cached between them. :func:`saved_plan` turns the
chosen prefix into a :class:`SavedPlan`, which
:class:`._saved_wrapper.SavedTensorWrapper` carries out.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from torch.utils._pytree import tree_leaves

from .._replay import Geometry, Ref, counted, operator_label
from .._saved_plan import DROP, LEAF, PACK, ReplayStep, SavedPlan
from ._records import ModuleProfile, OpCall, StepProfile

__all__ = [
    "SavedUnit",
    "prefix_seconds",
    "recipe_runs",
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
    dropped: frozenset[int] = frozenset()
    prefixes = []
    for unit in units:
        if unit.saved_bytes <= 0:
            continue
        if unit.action == DROP:
            rederived = _through(module, [*chosen, unit], dropped | unit.storages)
            if rederived is None:
                continue
            chosen, dropped = rederived, dropped | unit.storages
        else:
            chosen.append(unit)
        prefixes.append(list(chosen))
    return prefixes


def _through(
    module: _Module, chosen: list[SavedUnit], dropped: frozenset[int]
) -> list[SavedUnit] | None:
    """``chosen`` with each recipe that reads a storage in ``dropped`` recomputing it.

    A new unit's recipe may read tensors dropped before it, and a unit chosen earlier
    may read, as a kept leaf, a tensor the new one drops (a SiLU's input, the output of
    a matrix product, once the SiLU's output is dropped): either recipe then runs the
    dropping unit's calls first. ``None`` where a recipe cannot.
    """
    units = []
    for unit in chosen:
        if unit.action == DROP and unit.leaves & dropped:
            again = module.drop_unit(min(unit.storages), dropped)
            if again is None or again.storages != unit.storages:
                return None
            unit = again
        units.append(unit)
    return units


class _Step(Protocol):
    @property
    def outputs(self) -> tuple[int | None, ...]: ...


_S = TypeVar("_S", bound=_Step)


def recipe_runs(
    recipes: Mapping[int, Sequence[_S]], saved_at: Mapping[int, int]
) -> list[tuple[_S, int]]:
    """Each call the recipes of dropped storages run in one backward, and how many times.

    ``recipes`` maps each dropped storage to its calls, ``saved_at`` to the last
    position that saves it: backward unpacks it there first, later positions first.
    This is what :class:`.._saved_run.SavedRun` does. A storage's recipe runs in full at
    its first unpack unless an earlier recipe computed that storage on the way (it then
    waits in the run's cache). So a call shared by two recipes runs once where the
    storage it writes is dropped and unpacked after the first of them, and once per
    recipe where it writes an intermediate nothing saves.
    """
    cached: set[int] = set()
    runs: dict[int, tuple[_S, int]] = {}
    for index in sorted(recipes, key=lambda i: (-saved_at.get(i, -1), i)):
        if index in cached:
            continue
        for step in recipes[index]:
            runs[id(step)] = (step, runs.get(id(step), (step, 0))[1] + 1)
            cached.update(o for o in step.outputs if o is not None and o in recipes)
    return list(runs.values())


def prefix_seconds(
    units: list[SavedUnit], packs: Sequence[tuple[int | None, Any]], replay_seconds: float
) -> float:
    """What a prefix's recipes (:func:`recipe_runs`) and packs cost in one backward.

    ``packs`` is the module's saved tensors in the order its forward saves them.
    """
    recipes = {i: unit.steps for unit in units if unit.action == DROP for i in unit.storages}
    saved_at = {index: p for p, (index, _) in enumerate(packs) if index in recipes}
    seconds = sum(unit.seconds for unit in units if unit.action != DROP)
    runs = recipe_runs(recipes, saved_at)
    return seconds + sum(n * (call.seconds + replay_seconds) for call, n in runs)


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
