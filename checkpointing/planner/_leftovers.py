"""Planning leaves nothing behind: no tensor of the profiled step outlives it.

The profile runs the model's own code on fake tensors. Code that caches a tensor it
computes in forward (a relative-position index in an ``functools.lru_cache``, a mask in
a class-level dict, an attribute set on first use, a ``nonlocal`` in a closure) then
keeps a *fake* tensor, and the next real step that finds it in the cache fails
("Please convert all Tensors to FakeTensors first"), in this model and in every other
instance of its class. :func:`leaving_nothing` wraps the profiled step and removes,
afterwards, every reference to a tensor the step created that is still held outside
it. It works on whatever holds the tensor, not on a list of known caches:

* **before** the step it copies (shallowly) what the model's code may assign to: each
  module's ``__dict__`` in the model and the dicts and lists in it, the attributes of
  the model's module classes, the globals of the Python modules that define those
  classes, and the closure cells of the functions and methods found there;
* **during** the step, a dispatch mode (:func:`tracking`, entered by the profile above
  the fake-tensor mode) keeps a weak reference to every tensor an operator returns,
  and what autograd saves is boxed (:func:`keeping_saved`), the boxes emptied at the
  end, so that a step that fails before its backward frees its graph;
* **after** the step, the ones still alive are held by something outside it. From
  each, the collector's referrers lead to the nearest holder that can be mended:

  - an ``lru_cache`` or ``functools.cache`` (on a function or a method): cleared, so
    that its next call computes again;
  - a copied namespace (a module's attribute, a class attribute, a global, a closure
    variable): set back to the value it had before the step, or removed if it had none;
  - another namespace (a global, class attribute, closure variable or attribute
    elsewhere): set to ``None``, the unset state of a lazily filled cache;
  - any other dict, list or set (a cache): the entry holding the tensor is removed;
  - a tuple, a function, a bound method or another immutable holder: the walk goes on
    to what holds it, up to :data:`_DEPTH` levels;
  - a parameter's ``.grad``, written by a backward the model's code runs itself (a
    reversible layer's ``autograd.Function`` recomputes its block and backpropagates
    through it): put back as it was before the step.

Nothing is scanned when nothing is left, which is the common case; mending costs a few
passes of the collector (0.05 s each in a process that imported transformers). Frames
are left alone (an exception's traceback holds the step's locals until it is handled),
and only tensors the step's operators returned are followed, so the user's tensors are
never touched. After the real-tensor fallback (:mod:`._profile`) the tensors left are
real and like what any forward leaves in a cache: only the model's own modules are set
back then, so that no other code's tensors can be taken for the step's.
"""

from __future__ import annotations

import functools
import gc
import sys
import types
import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["keeping_saved", "leaving_nothing", "tracking"]

_DEPTH = 4  # holders between a tensor and the namespace or cache that keeps it
_LRU_CACHE = type(functools.lru_cache(maxsize=None)(len))
_MISSING = object()


class _Box:
    """What autograd keeps of a tensor the profiled step saves: the tensor, until emptied."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor | None) -> None:
        self.tensor = tensor


def _unbox(box: _Box) -> torch.Tensor:
    if box.tensor is None:
        raise RuntimeError(
            "checkpointing: backward through the planner's profiled step after it ended. "
            "This is a bug in the planner; please report it."
        )
    return box.tensor


class _Created(TorchDispatchMode):
    """Keeps a weak reference to every tensor an operator returns (fake ones only, or all).

    It also boxes what the step saves for backward (:func:`keeping_saved`).
    """

    def __init__(self, fake: bool) -> None:
        super().__init__()
        from torch._subclasses.fake_tensor import FakeTensor

        self.kind = FakeTensor if fake else torch.Tensor
        self.tensors: list[weakref.ref[torch.Tensor]] = []
        self.boxes: list[_Box] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        kind = self.kind
        self.tensors.extend(weakref.ref(t) for t in tree_leaves(out) if isinstance(t, kind))
        return out

    def alive(self) -> list[torch.Tensor]:
        found = {id(t): t for ref in self.tensors if (t := ref()) is not None}
        return list(found.values())


_ACTIVE: ContextVar[_Created | None] = ContextVar("_ACTIVE", default=None)


def tracking() -> AbstractContextManager[Any]:
    """The dispatch mode that records the step's tensors, inside :func:`leaving_nothing`."""
    created = _ACTIVE.get()
    return nullcontext() if created is None else created


def keeping_saved(record: Any) -> AbstractContextManager[Any]:
    """Saved-tensor hooks for the profiled step: ``record`` sees each saved tensor.

    Autograd keeps each in a box that :func:`leaving_nothing` empties when the step
    ends. A hook that kept the tensor itself would tie it to its own graph (the graph
    keeps the tensor, the tensor its graph) in a cycle the collector cannot see: a step
    that fails before its backward (a data-dependent operator, an operator without a
    fake kernel) would keep its tensors for good.
    """
    created = _ACTIVE.get()

    def pack(tensor: torch.Tensor) -> _Box:
        record(tensor)
        box = _Box(tensor)
        if created is not None:
            created.boxes.append(box)
        return box

    return torch.autograd.graph.saved_tensors_hooks(pack, _unbox)


def _functions(value: Any) -> Iterator[types.FunctionType]:
    """``value``'s function if it is one (or a static or class method), and what it wraps."""
    value = getattr(value, "__func__", value)
    for _ in range(_DEPTH):
        if not isinstance(value, types.FunctionType):
            return
        yield value
        value = getattr(value, "__wrapped__", None)


def _namespace(obj: Any) -> dict[str, Any] | None:
    """``obj.__dict__`` where it has one (not for classes, nor through a weak proxy)."""
    if issubclass(type(obj), type) or type(obj) in (weakref.ProxyType, weakref.CallableProxyType):
        return None
    try:
        namespace = object.__getattribute__(obj, "__dict__")
    except Exception:  # no __dict__ (slots, builtins)
        return None
    return namespace if isinstance(namespace, dict) else None


def _contents(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:
        return _MISSING


class _Snapshot:
    """What the model's code may assign to, as it was before the step (module docstring)."""

    def __init__(self, model: nn.Module) -> None:
        # Containers by id: (the container, a copy of its entries).
        self.model: dict[int, tuple[Any, Any]] = {}
        self.namespaces: dict[int, tuple[Any, Any]] = {}
        self.classes: dict[int, dict[str, Any]] = {}
        self.cells: dict[int, Any] = {}
        for module in model.modules():
            self._copy(module.__dict__, self.model)
            for value in list(module.__dict__.values()):
                if isinstance(value, (dict, list)):
                    self._copy(value, self.model)
            for owner in type(module).__mro__:
                if id(owner) in self.classes:
                    continue
                self.classes[id(owner)] = attributes = dict(vars(owner))
                self._cells(attributes.values())
                source = sys.modules.get(owner.__module__)
                namespace = getattr(source, "__dict__", None)
                if isinstance(namespace, dict) and id(namespace) not in self.namespaces:
                    self._copy(namespace, self.namespaces)
                    self._cells(namespace.values())

    def _cells(self, values: Any) -> None:
        for value in list(values):
            for function in _functions(value):
                for cell in function.__closure__ or ():
                    self.cells.setdefault(id(cell), _contents(cell))

    @staticmethod
    def _copy(container: Any, into: dict[int, tuple[Any, Any]]) -> None:
        copied = list(container) if isinstance(container, list) else dict(container)
        into[id(container)] = (container, copied)


def _restore(namespace: dict[Any, Any], before: dict[Any, Any] | None, held: set[int]) -> None:
    """Set ``namespace``'s entries that hold ``held`` objects back, or to None if unknown."""
    for key, value in list(namespace.items()):
        if id(value) not in held:
            continue
        old = None if before is None else before.get(key, _MISSING)
        if old is _MISSING:
            del namespace[key]
        else:
            namespace[key] = old


def _drop(container: Any, held: set[int]) -> None:
    if isinstance(container, dict):
        for key, value in list(container.items()):
            if id(value) in held or id(key) in held:
                del container[key]
    elif isinstance(container, list):
        container[:] = [item for item in container if id(item) not in held]
    else:
        for item in [item for item in container if id(item) in held]:
            container.discard(item)


class _Mender:
    """Walks up from the step's tensors to what holds them, and mends each holder."""

    def __init__(self, snapshot: _Snapshot, model_only: bool) -> None:
        self.snapshot = snapshot
        self.model_only = model_only

    def mend(self, tensors: list[torch.Tensor]) -> None:
        level: list[Any] = list(tensors)
        mine = {id(tensors)}
        seen: set[int] = set()
        for _ in range(_DEPTH):
            if not level:
                return
            held = {id(obj) for obj in level}
            seen |= held
            mine.add(id(level))
            climb: list[Any] = []
            for holder in gc.get_referrers(*level):
                if id(holder) in mine or id(holder) in seen:
                    continue
                if isinstance(holder, (types.FrameType, types.TracebackType)):
                    continue
                if not self._mend(holder, held):
                    climb.append(holder)
            level = climb

    def _mend(self, holder: Any, held: set[int]) -> bool:
        """Mend ``holder``'s references to ``held`` objects; False: climb past it."""
        copied = self.snapshot.model.get(id(holder))
        if copied is not None and copied[0] is holder:
            if isinstance(holder, list):
                holder[:] = copied[1]
            else:
                _restore(holder, copied[1], held)
            return True
        # From Python 3.13 the collector names the object whose attributes hold a tensor,
        # not its __dict__ (attributes are kept inline): mend the copied namespace.
        namespace = None if isinstance(holder, dict) else _namespace(holder)
        copied = None if namespace is None else self.snapshot.model.get(id(namespace))
        if copied is not None and copied[0] is namespace:
            _restore(namespace, copied[1], held)
            return True
        if self.model_only:
            return False
        if type(holder) is _LRU_CACHE:
            holder.cache_clear()
            return True
        if type(holder) is types.CellType:
            old = self.snapshot.cells.get(id(holder))
            if old is _MISSING:
                del holder.cell_contents
            else:
                holder.cell_contents = old
            return True
        if isinstance(holder, dict):
            return self._mend_dict(holder, held)
        if isinstance(holder, (list, set)):
            _drop(holder, held)
            return True
        if isinstance(holder, (tuple, frozenset, types.FunctionType, types.MethodType)):
            return False
        namespace = _namespace(holder)  # an object whose attributes the collector visits
        if namespace is not None and any(id(value) in held for value in namespace.values()):
            _restore(namespace, None, held)
            return True
        return False

    def _mend_dict(self, holder: dict[Any, Any], held: set[int]) -> bool:
        """A namespace's entries are set back (or to None); a cache's are removed."""
        copied = self.snapshot.namespaces.get(id(holder))
        if copied is not None and copied[0] is holder:
            _restore(holder, copied[1], held)
            return True
        for owner in gc.get_referrers(holder):
            if issubclass(type(owner), type):
                if any(id(value) in held for value in vars(owner).values()):
                    self._mend_class(owner, held)
                    return True
            elif _namespace(owner) is holder:  # a module's globals or an object's attributes
                _restore(holder, None, held)
                return True
        _drop(holder, held)
        return True

    def _mend_class(self, owner: type, held: set[int]) -> None:
        before = self.snapshot.classes.get(id(owner))
        for key, value in list(vars(owner).items()):
            if id(value) in held:
                old = None if before is None else before.get(key, _MISSING)
                if old is _MISSING:
                    delattr(owner, key)
                else:
                    setattr(owner, key, old)


@contextmanager
def leaving_nothing(model: nn.Module, fake: bool = True) -> Iterator[None]:
    """Remove, after the block, every reference to a tensor it created (module docstring).

    The block's operators must run under :func:`tracking`.

    Args:
        model: The profiled model.
        fake: Whether the block's tensors are fake (the fake-tensor profile); with
            ``False`` (the real-tensor fallback) only the model's modules are mended.
    """
    snapshot = _Snapshot(model)
    # A backward the model's own code runs (a reversible layer recomputing its block in
    # its autograd Function's backward) accumulates into the parameters' ``.grad``,
    # which no referrer walk reaches: each is put back as it was.
    gradients = [(parameter, parameter.grad) for parameter in model.parameters()]
    created = _Created(fake)
    token = _ACTIVE.set(created)
    try:
        yield
    finally:
        _ACTIVE.reset(token)
        for parameter, gradient in gradients:
            if parameter.grad is not gradient:
                parameter.grad = gradient
        for box in created.boxes:
            box.tensor = None
        tensors = created.alive()
        created.tensors.clear()
        if tensors:
            _Mender(snapshot, model_only=not fake).mend(tensors)
        del tensors
