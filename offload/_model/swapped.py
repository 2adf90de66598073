"""The ``"swap-data"`` strategy of :class:`offload.OffloadModel`: slices in fixed buffers.

Each slice's parameters and buffers are packed once into page-locked host memory
(:mod:`offload._model.slicing`); forward and backward load a slice into one of two fixed
device buffers (:class:`offload._model.residency.Residency`) and point its tensors'
``.data`` there while it computes. Each slice runs inside an autograd Function
(:mod:`offload._model.run`) whose backward is the slice's whole backward.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from accel import Accelerator

from .._core import strategy, transfer
from .._core.grads import GradientSink
from .._core.intercept import Interception
from .._core.storage import SliceStorage
from .._core.transfer import HostPool, Transfers
from .._state import StateMachine
from .config import Config, Pass
from .residency import Residency
from .run import run_slice
from .slicing import pack_slices

__all__ = ["SwapSlices"]


class SwapSlices:
    """Slices packed in host memory, loaded into two fixed device buffers in turn.

    Args:
        layers: The model's layers.
        runs: Each slice's layers, as index ranges.
        backend: The backend.
        device: The compute device.
        home: Where parameters live (the host).
        state: The model's state machine (a slice's backward moves it).
        checkpoint_activation: Recompute each slice in backward, its inputs in host memory.
        num_microbatches: Micro-batches per slice.
        batched_kwargs: Keyword arguments split with the batch.
    """

    name: strategy.StrategyName = strategy.SWAP_DATA

    def __init__(
        self,
        layers: Sequence[nn.Module],
        runs: Sequence[range],
        backend: Accelerator,
        device: torch.device,
        home: torch.device,
        state: StateMachine,
        *,
        checkpoint_activation: bool,
        num_microbatches: int,
        batched_kwargs: frozenset[str],
    ) -> None:
        copy = transfer.copies_needed(device, home)
        if not copy:
            for layer in layers:
                layer.to(device)
        transfers = Transfers(backend)
        storages, shared = pack_slices(layers, runs, transfers, copy=copy)
        self.storages: list[SliceStorage] = storages
        self.residency = Residency(storages, transfers, device, copy=copy, shared=shared)
        interception = None
        if copy:  # gradients go straight into the slice buffers' gradient memory
            every = [*storages, *(storage for storage, _ in shared)]
            parameters = [p for storage in every for p in storage.parameters]
            sink = GradientSink.of_parameters(parameters, self.residency.destinations)
            interception = Interception(sink)
        self.config = Config(
            backend=backend,
            device=device,
            slices=storages,
            residency=self.residency,
            transfers=transfers,
            pool=HostPool(transfers),
            state=state,
            checkpoint_activation=checkpoint_activation,
            num_microbatches=num_microbatches,
            batched_kwargs=batched_kwargs,
            copy=copy,
            trainable_dummy=torch.empty(0, requires_grad=True),
            frozen_dummy=torch.empty(0),
            interception=interception,
        )

    @property
    def slice_bytes(self) -> tuple[int, ...]:
        """Bytes of parameters and buffers in each slice."""
        return tuple(storage.nbytes for storage in self.storages)

    @property
    def resident(self) -> tuple[int, ...]:
        """Indices of the slices in device memory now (at most two)."""
        return self.residency.resident

    @property
    def max_resident(self) -> int:
        """The most slices in device memory at once since construction."""
        return self.residency.max_resident

    def forward(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], batch: int | None
    ) -> tuple[tuple[Any, ...], bool]:
        """Run every slice; return the last one's values and whether it returned a tuple."""
        self.residency.invalidate()
        self.residency.drop_pending()
        pass_ = Pass(self.config, batch)
        values: tuple[Any, ...] = args
        returned_tuple = True
        try:
            for index in range(len(self.storages)):
                values, run = run_slice(self.config, pass_, index, values, kwargs)
                returned_tuple = run.returned_tuple
            if any(storage.buffers for storage in self.storages) or not torch.is_grad_enabled():
                self.config.transfers.wait_host()
        except BaseException:
            self.residency.release_all(buffers_to_host=True)
            raise
        return values, returned_tuple

    def is_home(self) -> bool:
        """Whether every parameter and buffer is in its host memory."""
        return not self.residency.attached and all(s.is_home() for s in self.storages)

    def recover(self) -> None:
        """Bring every parameter and gradient back to host memory."""
        self.residency.release_all(buffers_to_host=False)
