"""Measuring activation memory: the bytes autograd keeps for backward."""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from types import TracebackType
from typing import Any

import torch

__all__ = [
    "LiveActivationMeter",
    "SavedTensorMeter",
    "graph_saved_bytes",
    "held_bytes",
    "storage_key",
]


def storage_key(tensor: torch.Tensor) -> int:
    """An identity for ``tensor``'s storage, shared by its views, on any device.

    The address of torch's storage object, not of its bytes: fake tensors, a lazy
    device's tensors and meta tensors have storages but no data pointer. It is unique
    while the storage is alive and may be reused after it is freed.
    """
    return int(tensor.untyped_storage()._cdata)


class SavedTensorMeter:
    """Count the bytes of the storages autograd saves for backward while active.

    Each storage counts once however many saved tensors view it, and storages of
    ``exclude`` (usually the model's parameters, which exist anyway) are not counted.
    Works on every device, so it measures activation memory where the backend keeps no
    memory statistics (the host).

    Example::

        with SavedTensorMeter(exclude=model.parameters()) as meter:
            loss = model(x).sum()
        print(meter.bytes)          # what checkpointing saves you
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        self._excluded = {storage_key(tensor) for tensor in exclude}
        self._storages: dict[int, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    @property
    def bytes(self) -> int:
        """Bytes of the distinct storages saved so far."""
        return sum(self._storages.values())

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage_key(tensor) not in self._excluded:
            self._storages[storage_key(tensor)] = storage.nbytes()
        return tensor

    @staticmethod
    def _unpack(tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def __enter__(self) -> SavedTensorMeter:
        self._storages.clear()
        self._hooks.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._hooks.__exit__(exc_type, exc, traceback)


class LiveActivationMeter:
    """Bytes of the storages created inside the context that are still alive.

    Read after a forward, this is the activation memory the step holds until backward,
    whoever holds it: autograd's saved tensors, a selective checkpoint's cache of kept
    operator outputs, the output itself. Used by the budget benchmark and tests, where
    :class:`SavedTensorMeter` would miss what a selective policy keeps outside autograd.

    :attr:`peak_bytes` is the most those storages held at once while the context was
    active (counted at every operator, freed storages subtracted as they go): the peak
    of a whole training step, or of planning, on a device whose allocator keeps no
    statistics (the host).

    Example::

        with LiveActivationMeter(exclude=model.parameters()) as meter:
            model(x).sum().backward()
        print(meter.peak_bytes)     # the step's peak of live tensors
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        excluded = {storage_key(tensor) for tensor in exclude}
        # Liveness comes from finalizers on the storages, never from references to them:
        # even a weak reference to a storage (StorageWeakRef) keeps its bytes allocated.
        tracked: dict[int, int] = {}  # storage (cdata) to bytes, while alive
        foreign: set[int] = set()  # storages that were there before (inputs), alive
        since: set[int] = set()  # storages created since the meter was last entered
        totals = [0, 0]  # bytes alive now, the most alive at once
        self._tracked, self._since, self._totals = tracked, since, totals

        def freed(key: int) -> None:
            totals[0] -= tracked.pop(key, 0)
            foreign.discard(key)
            since.discard(key)

        def key_of(storage: Any) -> int:
            return int(storage._cdata)

        def track(storage: Any) -> None:
            key = key_of(storage)
            if key in tracked or key in foreign:
                return
            tracked[key] = storage.nbytes()
            since.add(key)
            totals[0] += tracked[key]
            totals[1] = max(totals)
            weakref.finalize(storage, freed, key)

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(
                self, func: Any, types: Any, args: Any = (), kwargs: Any = None
            ) -> Any:
                for leaf in torch.utils._pytree.tree_leaves((args, kwargs)):
                    if isinstance(leaf, torch.Tensor) and _holds_memory(leaf):
                        storage = leaf.untyped_storage()
                        key = key_of(storage)
                        if key not in tracked and key not in foreign:
                            foreign.add(key)
                            weakref.finalize(storage, freed, key)
                out = func(*args, **(kwargs or {}))
                for leaf in torch.utils._pytree.tree_leaves(out):
                    if isinstance(leaf, torch.Tensor) and _holds_memory(leaf):
                        storage = leaf.untyped_storage()
                        if key_of(storage) not in excluded:
                            track(storage)
                return out

        self._mode = _Mode()

    @property
    def bytes(self) -> int:
        """Bytes of the distinct storages created in the context and still alive."""
        return sum(self._tracked[key] for key in self._since if key in self._tracked)

    @property
    def peak_bytes(self) -> int:
        """The most bytes the storages created in the context held at once."""
        return self._totals[1]

    def __enter__(self) -> LiveActivationMeter:
        self._since.clear()
        self._totals[1] = self._totals[0] = sum(self._tracked.values())
        self._mode.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._mode.__exit__(*exc_info)


def held_bytes(
    live: LiveActivationMeter, saved: SavedTensorMeter, output: Iterable[torch.Tensor]
) -> int:
    """The activation bytes a forward holds for backward, read from both meters after it.

    What the forward created that is still alive (``live``), less its ``output``
    tensors' storages where autograd did not save them, plus what autograd saved that
    the forward did not create (its inputs): the bytes the planner's profile counts,
    whatever keeps them (autograd, a checkpoint's inputs, a selective cache).
    """
    outputs = {storage_key(tensor) for tensor in output}
    held = {
        key: live._tracked[key]
        for key in live._since
        if key in live._tracked and (key not in outputs or key in saved._storages)
    }
    held.update(saved._storages)
    return sum(held.values())


def _holds_memory(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s storage holds bytes (a meta or fake tensor holds none)."""
    from torch._subclasses.fake_tensor import FakeTensor

    return tensor.device.type != "meta" and not isinstance(tensor, FakeTensor)


def graph_saved_bytes(
    outputs: Any,
    exclude: Iterable[torch.Tensor] = (),
    *,
    copies_of: Iterable[torch.Tensor] = (),
) -> int:
    """Bytes of the storages the autograd graph behind ``outputs`` saves, found by walking it.

    The meter for a compiled step: a compiled graph saves its activations in one autograd
    node, read here, where saved-tensor hooks around the compiled call would make dynamo
    compile it again. Every node's saved tensors count, each storage once, storages of
    ``exclude`` (parameters, buffers) not at all. Reading a saved tensor runs its unpack
    hook, so this is for graphs without checkpoint hooks (a compiled graph's checkpointed
    regions have none).

    Args:
        outputs: Tensors, or a structure of them (a model's output).
        exclude: Tensors whose storages are not counted.
        copies_of: A saved tensor in a storage of its own with the shape, dtype and values
            of one of these is a copy of it in another memory layout, and is not counted:
            inductor lays convolution weights out channels-last and saves those copies
            for backward, in the plain compiled step as in a planned one. They grow with
            the parameters, not with the batch, so they are no activations.
    """
    excluded = {storage_key(tensor) for tensor in exclude}
    originals: dict[tuple[Any, ...], list[torch.Tensor]] = {}
    for tensor in copies_of:
        originals.setdefault((tuple(tensor.shape), tensor.dtype), []).append(tensor.detach())

    def is_copy(value: torch.Tensor) -> bool:
        found = originals.get((tuple(value.shape), value.dtype), ())
        return any(torch.equal(value, original) for original in found)

    leaves = torch.utils._pytree.tree_leaves(outputs)
    stack: list[Any] = [t.grad_fn for t in leaves if isinstance(t, torch.Tensor)]
    seen: set[int] = set()
    storages: dict[int, int] = {}
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        values: list[Any] = list(getattr(node, "saved_tensors", ()) or ())
        values += [getattr(node, name) for name in dir(node) if name.startswith("_saved_")]
        for value in torch.utils._pytree.tree_leaves(values):
            if not isinstance(value, torch.Tensor) or storage_key(value) in excluded:
                continue
            if not is_copy(value):
                storages[storage_key(value)] = value.untyped_storage().nbytes()
        stack.extend(function for function, _ in node.next_functions)
    return sum(storages.values())
