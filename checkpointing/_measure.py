"""Measuring activation memory: the bytes autograd keeps for backward."""

from __future__ import annotations

from collections.abc import Iterable
from types import TracebackType

import torch

__all__ = ["SavedTensorMeter"]


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
        self._excluded = {tensor.untyped_storage().data_ptr() for tensor in exclude}
        self._storages: dict[int, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    @property
    def bytes(self) -> int:
        """Bytes of the distinct storages saved so far."""
        return sum(self._storages.values())

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self._excluded:
            self._storages[storage.data_ptr()] = storage.nbytes()
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
