"""Planning leaves nothing behind: no tensor of the profiled step outlives it.

The profile runs the model's own code on fake tensors. Code that caches a tensor it
computes in forward (a relative-position index in an ``functools.lru_cache``, a mask in
a class-level dict, an attribute set on first use, a ``nonlocal`` in a closure) then
keeps a *fake* tensor, and the next real step that finds it in the cache fails
("Please convert all Tensors to FakeTensors first"), in this model and in every other
instance of its class. :func:`leaving_nothing` wraps the profiled step and removes,
afterwards, every reference to a tensor the step created that is still held outside
it. It works on whatever holds the tensor, not on a list of known caches:

* **before** the step it takes ``gc.get_objects()`` (held until the end, so that no
  object's id is reused meanwhile), the ids of the tensors alive, and shallow copies of
  the namespaces a step may assign to: every module's ``__dict__`` in the model and
  the dicts and lists in it, the attributes of the model's module classes, every
  Python module's globals and every closure cell;
* **after** the step it finds the tensors that are new (fake tensors after the fake
  step), then walks up from them with ``gc.get_referrers`` to the nearest holder it can
  mend, and mends it:

  - an ``lru_cache`` or ``functools.cache`` (on a function or a method): cleared, so
    that its next call computes again;
  - a copied namespace (a module's attribute, a class attribute, a global, a closure
    variable): set back to the value it had before the step, or removed if it had none;
  - an attribute of another class, or of another object that existed before the step:
    removed;
  - any other dict, list or set (a cache): the entry holding the tensor is removed;
  - a tuple, a new object, a new closure, a bound method: the walk goes on to what
    holds it, up to :data:`_DEPTH` levels.

Frames are left alone (an exception's traceback holds the step's locals until it is
handled), and only tensors the step created are followed, so the user's own tensors
are never touched. After the real-tensor fallback (:mod:`._profile`) the new tensors
are real and like what any forward leaves in a cache; only the model's own modules are
set back then, so that another thread's tensors cannot be taken for the step's. The
two passes over the collector's objects take 0.1 to 0.3 s in a process that imported
transformers (350,000 objects).
"""

from __future__ import annotations

import functools
import gc
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

__all__ = ["leaving_nothing"]

_DEPTH = 4  # holders between a tensor and the namespace or cache that keeps it
_LRU_CACHE = type(functools.lru_cache(maxsize=None)(len))
_MISSING = object()
_REAL_KINDS = (torch.Tensor, nn.Parameter)


def _fake_kinds() -> tuple[type, ...]:
    from torch._subclasses.fake_tensor import FakeTensor

    return (FakeTensor,)


class _Snapshot:
    """What the namespaces a step may assign to held before it, and its tensors."""

    def __init__(self, model: nn.Module, kinds: tuple[type, ...]) -> None:
        self.kinds = kinds
        self.objects = gc.get_objects()
        self._ids: set[int] | None = None
        self.cells: dict[int, Any] = {}
        self.tensors: set[int] = set()
        cell = types.CellType
        for obj in self.objects:
            kind = type(obj)
            if kind is cell:
                self.cells[id(obj)] = _contents(obj)
            elif kind in kinds:
                self.tensors.add(id(obj))
        # The model's own containers, by id: (the container, a copy of its entries).
        self.model: dict[int, tuple[Any, Any]] = {}
        self.classes: dict[int, dict[str, Any]] = {}
        for module in model.modules():
            self._copy(module.__dict__, self.model)
            for value in list(module.__dict__.values()):
                if isinstance(value, (dict, list)):
                    self._copy(value, self.model)
            for owner in type(module).__mro__:
                self.classes.setdefault(id(owner), dict(vars(owner)))
        self.globals: dict[int, tuple[Any, Any]] = {}
        for loaded in list(sys.modules.values()):
            namespace = getattr(loaded, "__dict__", None)
            if isinstance(namespace, dict):
                self._copy(namespace, self.globals)

    def existed(self, obj: Any) -> bool:
        """Whether ``obj`` was alive before the step (ids stay unique: all are held)."""
        if self._ids is None:
            self._ids = {id(item) for item in self.objects}
        return id(obj) in self._ids

    def new_tensors(self) -> list[torch.Tensor]:
        """The tensors of the snapshot's kinds that are alive now and were not before."""
        # An instance of a Python class refers to its class, so the collector finds
        # them all in one pass in C.
        kinds = self.kinds
        return [
            obj
            for obj in gc.get_referrers(*kinds)
            if type(obj) in kinds and id(obj) not in self.tensors
        ]

    @staticmethod
    def _copy(container: Any, into: dict[int, tuple[Any, Any]]) -> None:
        copied = list(container) if isinstance(container, list) else dict(container)
        into[id(container)] = (container, copied)


def _contents(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:
        return _MISSING


def _restore_entries(namespace: dict[Any, Any], before: dict[Any, Any], held: set[int]) -> None:
    for key, value in list(namespace.items()):
        if id(value) in held:
            old = before.get(key, _MISSING)
            if old is _MISSING:
                del namespace[key]
            else:
                namespace[key] = old


def _drop_entries(container: Any, held: set[int]) -> None:
    if isinstance(container, dict):
        for key, value in list(container.items()):
            if id(value) in held or id(key) in held:
                del container[key]
    elif isinstance(container, list):
        container[:] = [item for item in container if id(item) not in held]
    elif isinstance(container, set):
        for item in [item for item in container if id(item) in held]:
            container.discard(item)


class _Mender:
    """Walks up from the step's tensors to what holds them, and mends each holder."""

    def __init__(self, snapshot: _Snapshot, model_only: bool) -> None:
        self.snapshot = snapshot
        self.model_only = model_only
        self.seen: set[int] = set()

    def mend(self, tensors: list[torch.Tensor]) -> None:
        level: list[Any] = list(tensors)
        mine = {id(level), id(tensors), id(self.snapshot.objects)}
        for _ in range(_DEPTH):
            if not level:
                return
            held = {id(obj) for obj in level}
            self.seen |= held
            climb: list[Any] = []
            for holder in gc.get_referrers(*level):
                if id(holder) in mine or id(holder) in self.seen:
                    continue
                if isinstance(holder, (types.FrameType, types.TracebackType)):
                    continue
                if not self._mend(holder, held):
                    climb.append(holder)
            mine.add(id(climb))
            level = climb

    def _mend(self, holder: Any, held: set[int]) -> bool:
        """Mend ``holder``'s references to ``held`` objects; False: climb past it."""
        snapshot = self.snapshot
        copied = snapshot.model.get(id(holder))
        if copied is None and not self.model_only:
            copied = snapshot.globals.get(id(holder))
        if copied is not None and copied[0] is holder:
            if isinstance(holder, list):
                holder[:] = [item for item in copied[1]]
            else:
                _restore_entries(holder, copied[1], held)
            return True
        if self.model_only:
            return False
        if type(holder) is _LRU_CACHE:
            holder.cache_clear()
            return True
        if type(holder) is types.CellType:
            if id(holder) not in snapshot.cells:
                return False
            old = snapshot.cells[id(holder)]
            if old is _MISSING:
                del holder.cell_contents
            else:
                holder.cell_contents = old
            return True
        if isinstance(holder, dict):
            return self._mend_dict(holder, held)
        if isinstance(holder, (list, set)):
            _drop_entries(holder, held)
            return True
        return self._mend_object(holder, held)

    def _mend_dict(self, holder: dict[Any, Any], held: set[int]) -> bool:
        for owner in gc.get_referrers(holder):
            if issubclass(type(owner), type) and any(
                id(value) in held for value in vars(owner).values()
            ):
                self._mend_class(owner, held)
                return True
            if getattr(owner, "__dict__", None) is holder and not issubclass(type(owner), type):
                return self._mend_object(owner, held)
        _drop_entries(holder, held)
        return True

    def _mend_class(self, owner: type, held: set[int]) -> None:
        before = self.snapshot.classes.get(id(owner), {})
        for key, value in list(vars(owner).items()):
            if id(value) in held:
                old = before.get(key, _MISSING)
                if old is _MISSING:
                    delattr(owner, key)
                else:
                    setattr(owner, key, old)

    def _mend_object(self, owner: Any, held: set[int]) -> bool:
        """An attribute of an object that existed before the step is removed."""
        if not self.snapshot.existed(owner) or isinstance(owner, (tuple, frozenset)):
            return False
        namespace = getattr(owner, "__dict__", None)
        if not isinstance(namespace, dict):
            return False
        keys = [key for key, value in namespace.items() if id(value) in held]
        for key in keys:
            del namespace[key]
        return bool(keys)


@contextmanager
def leaving_nothing(model: nn.Module, fake: bool = True) -> Iterator[None]:
    """Remove, after the block, every reference to a tensor it created (module docstring).

    Args:
        model: The profiled model.
        fake: Whether the block's tensors are fake (the fake-tensor profile); with
            ``False`` (the real-tensor fallback) only the model's modules are mended.
    """
    snapshot = _Snapshot(model, _fake_kinds() if fake else _REAL_KINDS)
    try:
        yield
    finally:
        tensors = snapshot.new_tensors()
        if tensors:
            _Mender(snapshot, model_only=not fake).mend(tensors)
        del tensors
        snapshot.objects.clear()
