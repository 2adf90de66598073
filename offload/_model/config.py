"""What one forward through an :class:`offload.OffloadModel`'s slices works with.

:class:`Config` is everything a pass needs from its model; :class:`Pass` remembers one
forward's slice runs (weakly), so that a slice's backward can prefetch the one before
it. The runs themselves (:class:`offload._model.slice_run.SliceRun`) are seen here only through
:class:`PassRun`, so imports flow one way: ``config`` <- ``slice_run`` <- ``run``.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Protocol

import torch

from accel import Accelerator

from .._core.intercept import Interception
from .._core.storage import SliceStorage
from .._core.transfer import HostPool, Transfers
from .._state import StateMachine
from .residency import Residency

__all__ = ["Config", "Pass", "PassRun"]


class PassRun(Protocol):
    """What a pass asks of a slice's run: its index, and to start restoring its inputs."""

    @property
    def index(self) -> int: ...

    def issue_restore(self) -> None: ...


@dataclass
class Config:
    """Everything a pass needs from its model."""

    backend: Accelerator
    device: torch.device
    slices: list[SliceStorage]
    residency: Residency
    transfers: Transfers
    pool: HostPool
    state: StateMachine
    checkpoint_activation: bool
    num_microbatches: int
    batched_kwargs: frozenset[str]
    copy: bool
    trainable_dummy: torch.Tensor
    frozen_dummy: torch.Tensor
    #: The layers that write gradients in place (``None``: nothing is copied).
    interception: Interception | None = None


class Pass:
    """One forward's slice runs, so that a slice's backward can prefetch the one before.

    It holds the runs weakly: they live as long as the autograd graph that owns them.
    """

    def __init__(self, config: Config, batch: int | None) -> None:
        self.config = config
        self.batch = batch
        self.first_graph: int | None = None
        self._runs: dict[int, weakref.ref[PassRun]] = {}

    def add(self, run: PassRun) -> None:
        self._runs[run.index] = weakref.ref(run)

    def run(self, index: int) -> PassRun | None:
        ref = self._runs.get(index)
        return ref() if ref is not None else None
