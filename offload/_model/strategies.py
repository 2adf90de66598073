"""How an :class:`offload.OffloadModel`'s slices reach the device: its two strategies.

The model holds one :class:`SliceStrategy`, made by :func:`make_strategy` from the name
:func:`offload._core.strategy.choose` gives for the device:

* ``"swap-data"``: :class:`offload._model.swapped.SwapSlices`, slices packed in host
  memory and loaded into two fixed device buffers, each parameter's ``.data`` pointed at
  its place there while its slice computes;
* ``"copy-parameters"``: :class:`offload._model.copied.CopySlices`, parameters reaching
  the device as differentiable copies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import nn

from accel import Accelerator

from .._core import strategy
from .._core.copies import require_host
from .._state import StateMachine
from .copied import CopySlices
from .swapped import SwapSlices

__all__ = ["SliceStrategy", "make_strategy"]


class SliceStrategy(Protocol):
    """What a strategy does for its model: run the slices, report residency, recover."""

    @property
    def name(self) -> strategy.StrategyName: ...

    @property
    def slice_bytes(self) -> tuple[int, ...]: ...

    @property
    def resident(self) -> tuple[int, ...]: ...

    @property
    def max_resident(self) -> int: ...

    def forward(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], batch: int | None
    ) -> tuple[tuple[Any, ...], bool]:
        """Run every slice; return the last one's values and whether it returned a tuple.

        On an exception, everything is back in host memory before it propagates.
        """
        ...

    def is_home(self) -> bool: ...

    def recover(self) -> None: ...


def make_strategy(
    model: nn.Module,
    layers: Sequence[nn.Module],
    runs: Sequence[range],
    *,
    backend: Accelerator,
    device: torch.device,
    home: torch.device,
    state: StateMachine,
    checkpoint_activation: bool,
    num_microbatches: int,
    batched_kwargs: frozenset[str],
) -> SliceStrategy:
    """Return the strategy :func:`offload._core.strategy.choose` names for ``device``.

    Raises:
        offload.OffloadConfigError: The copy strategy got a model away from the host.
    """
    options: dict[str, Any] = {
        "checkpoint_activation": checkpoint_activation,
        "num_microbatches": num_microbatches,
        "batched_kwargs": batched_kwargs,
    }
    if strategy.choose(device, home) == strategy.COPY_PARAMETERS:
        require_host(model, device)
        return CopySlices(layers, runs, backend, device, **options)
    return SwapSlices(layers, runs, backend, device, home, state, **options)
