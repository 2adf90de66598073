"""``SelectiveCheckpointWrapper``: a checkpoint that keeps some operators' outputs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from accel import Accelerator

from ._caches import refuse_cache_arguments
from ._checkpoint import run_checkpoint
from ._selective import kept_calls_context_fn, selective_context_fn
from ._wrapper import CheckpointWrapper

__all__ = ["SelectiveCheckpointWrapper"]


class SelectiveCheckpointWrapper(CheckpointWrapper):
    """A :class:`CheckpointWrapper` that keeps some operators' outputs.

    By default the outputs of matrix products, convolutions and attention are kept and
    pointwise operators, dropout and normalisation are recomputed in backward. With
    ``kept_calls``, exactly those ``(operator, occurrence)`` calls are kept (a plan's
    chosen calls). With ``every_second_mm``, the 2nd, 4th, ... ``aten.mm`` of each
    call is recomputed too (torchtitan's rule). Always the non-reentrant variant (a
    selective policy needs it).
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        preserve_rng_state: bool = True,
        backend: Accelerator | None = None,
        kept_calls: Sequence[tuple[str, int]] | None = None,
        name: str = "",
        every_second_mm: bool = False,
    ) -> None:
        if kept_calls is not None and every_second_mm:
            raise ValueError(
                "checkpointing: SelectiveCheckpointWrapper takes kept_calls or "
                "every_second_mm, not both: kept_calls names every kept call already. "
                "Pass one of them."
            )
        super().__init__(module, preserve_rng_state=preserve_rng_state, backend=backend)
        self.kept_calls = None if kept_calls is None else tuple(kept_calls)
        self.every_second_mm = every_second_mm
        self._context_fn = (
            selective_context_fn(every_second_mm)
            if self.kept_calls is None
            else kept_calls_context_fn(self.kept_calls, name)
        )

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the wrapped module's forward as a selective checkpoint."""
        if torch.compiler.is_compiling() and not self._traced:
            return self._outside_graph(*args, **kwargs)
        if torch.is_grad_enabled():
            refuse_cache_arguments(self.module, args, kwargs)
        return run_checkpoint(
            self.module,
            args,
            kwargs,
            use_reentrant=False,
            preserve_rng_state=self.preserve_rng_state,
            backend=self._backend_ref.get(),
            context_fn=self._context_fn,
        )

    def extra_repr(self) -> str:
        if self.kept_calls is not None:
            return f"selective: {len(self.kept_calls)} chosen operator calls kept"
        if self.every_second_mm:
            return "selective: matmul and attention outputs kept, but every second mm"
        return "selective: matmul and attention outputs kept"
