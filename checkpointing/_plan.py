"""``CheckpointPlan``: which modules to checkpoint, at which grain, and what it costs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from accel import Accelerator

from ._caches import refuse_cache_arguments, switch_off_kv_cache
from ._checkpoint import run_checkpoint
from ._decisions import FULL, KEEP, MEASURED, SAVED, SELECTIVE
from ._root import checkpoint_root, root_checkpointed
from ._saved_grain import SavedPlan
from ._saved_wrapper import SavedTensorWrapper
from ._selective import kept_calls_context_fn, selective_context_fn
from ._wrapper import CheckpointWrapper, checkpoint_wrapper

__all__ = [
    "FULL",
    "KEEP",
    "MEASURED",
    "SAVED",
    "SELECTIVE",
    "CheckpointPlan",
    "ConsideredPlan",
    "PlanRow",
    "SelectiveCheckpointWrapper",
]


class SelectiveCheckpointWrapper(CheckpointWrapper):
    """A :class:`CheckpointWrapper` that keeps some operators' outputs.

    By default the outputs of matrix products, convolutions and attention are kept and
    pointwise operators, dropout and normalisation are recomputed in backward. With
    ``kept_calls``, exactly those ``(operator, occurrence)`` calls are kept (a plan's
    measured choice). Always the non-reentrant variant (a selective policy needs it).
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        preserve_rng_state: bool = True,
        backend: Accelerator | None = None,
        kept_calls: Sequence[tuple[str, int]] | None = None,
        name: str = "",
    ) -> None:
        super().__init__(module, preserve_rng_state=preserve_rng_state, backend=backend)
        self.kept_calls = None if kept_calls is None else tuple(kept_calls)
        self._context_fn = (
            selective_context_fn()
            if self.kept_calls is None
            else kept_calls_context_fn(self.kept_calls, name)
        )

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the wrapped module's forward as a selective checkpoint."""
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
            return f"selective: {len(self.kept_calls)} measured operator calls kept"
        return "selective: matmul and attention outputs kept"


@dataclass(frozen=True)
class PlanRow:
    """One line of a plan: a module and what the plan does with it."""

    module: str
    kind: str
    decision: str
    kept_bytes: int
    recompute_seconds: float


@dataclass(frozen=True)
class ConsideredPlan:
    """A whole-model plan the planner weighed (see :attr:`CheckpointPlan.considered`)."""

    label: str
    estimated_bytes: int
    estimated_seconds: float  # recompute time, estimated
    measured_seconds: float | None  # recompute time measured in place, if timed
    fits: bool  # estimated bytes within the budget (less any overshoot measured in place)
    taken: bool
    reason: str = ""  # why it was taken or not: the estimate, or in-place timing rounds


def _mib(count: int) -> str:
    return f"{count / 2**20:.2f} MiB"


@dataclass(frozen=True)
class CheckpointPlan:
    """What :func:`plan_checkpointing` decided, and what it expects that to cost.

    Printing a plan shows one row per module considered (the activation bytes it keeps
    under the decision, the estimated time to recompute it in backward, and the
    decision) and the totals.

    Attributes:
        decisions: Qualified module name to ``"checkpoint"`` (whole module),
            ``"recompute cheap ops"`` (selective by operator class), ``"keep costly
            ops"`` (selective by measured call) or ``"recompute saved"`` (saved-tensor
            grain), in visiting order.
        rows: The table's rows.
        plain_bytes: Activation bytes of the plain model (autograd-saved storages).
        estimated_bytes: Activation bytes expected under the plan.
        estimated_step_time_ratio: Expected step time over the plain step time.
        budget_bytes: The budget the plan was made for, in bytes.
        step_seconds: The measured plain step time.
        device_peak_bytes: The device's peak allocation while planning
            (``max_memory_allocated``), above what was allocated before, or ``None``
            where the backend keeps no memory statistics.
        device_bytes: Memory planning left allocated on the device (0 unless
            something leaked), or ``None`` where the backend keeps no statistics.
        note: Why a grain was unavailable, or empty.
        kept_calls: For each ``"keep costly ops"`` module, the ``(operator,
            occurrence)`` calls whose outputs it keeps.
        saved_plans: For each ``"recompute saved"`` module (saved-tensor grain: some
            of its saved tensors recomputed from others or packed, nothing
            checkpointed whole), what becomes of each saved tensor.
    """

    decisions: dict[str, str]
    rows: tuple[PlanRow, ...]
    plain_bytes: int
    estimated_bytes: int
    estimated_step_time_ratio: float
    budget_bytes: int
    step_seconds: float
    device_bytes: int | None = None
    device_peak_bytes: int | None = None
    note: str = ""
    kept_calls: dict[str, tuple[tuple[str, int], ...]] = field(default_factory=dict)
    saved_plans: dict[str, SavedPlan] = field(default_factory=dict)
    considered: tuple[ConsideredPlan, ...] = ()

    def apply(
        self,
        model: nn.Module,
        *,
        preserve_rng_state: bool = True,
        backend: Accelerator | None = None,
    ) -> list[str]:
        """Wrap, in place, the modules of ``model`` the plan checkpoints.

        ``model`` is the planned model or one built the same way (same module names).
        The root (name ``""``, decided where the model's own operators save
        activations) is checkpointed whole by setting ``model.forward`` to a
        checkpoint around the class's forward; the model stays the same object.
        A transformers ``config.use_cache`` that is ``True`` is set to ``False``, with a
        warning (recomputation would append to the KV cache twice).

        Returns:
            The qualified names of the wrapped modules.

        Raises:
            ValueError: If ``model`` lacks a module the plan names, or it is already
                wrapped.
        """
        targets: list[tuple[str, nn.Module, str, nn.Module]] = []
        for name in self.decisions:
            if not name:
                self._check_root(model)
                continue
            parent_name, _, leaf = name.rpartition(".")
            try:
                parent = model.get_submodule(parent_name)
                child = parent.get_submodule(leaf)
            except AttributeError as error:
                raise ValueError(
                    f"checkpointing: this plan checkpoints {name!r}, which the model does "
                    f"not have ({error}). Apply a plan to the model it was made for, or "
                    "to one built the same way."
                ) from None
            if isinstance(child, CheckpointWrapper):
                raise ValueError(
                    f"checkpointing: {name!r} is already checkpointed; apply a plan to a "
                    "model without checkpoint wrappers."
                )
            if self.decisions[name] == MEASURED and name not in self.kept_calls:
                raise ValueError(
                    f"checkpointing: this plan keeps measured operator calls in {name!r} "
                    "but names none in kept_calls. Use a plan made by plan_checkpointing, "
                    "or give kept_calls an entry for every 'keep costly ops' module."
                )
            if self.decisions[name] == SAVED and name not in self.saved_plans:
                raise ValueError(
                    f"checkpointing: this plan recomputes saved tensors of {name!r} but "
                    "has no saved plan for it. Use a plan made by plan_checkpointing, or "
                    "give saved_plans an entry for every 'recompute saved' module."
                )
            targets.append((name, parent, leaf, child))
        switch_off_kv_cache(model)
        if "" in self.decisions:
            checkpoint_root(model, preserve_rng_state=preserve_rng_state, backend=backend)
        for name, parent, leaf, child in targets:
            if self.decisions[name] == SAVED:
                wrapper: nn.Module = SavedTensorWrapper(
                    child, self.saved_plans[name], backend=backend
                )
            elif self.decisions[name] in (SELECTIVE, MEASURED):
                wrapper = SelectiveCheckpointWrapper(
                    child,
                    preserve_rng_state=preserve_rng_state,
                    backend=backend,
                    kept_calls=self.kept_calls[name] if self.decisions[name] == MEASURED else None,
                    name=name,
                )
            else:
                wrapper = checkpoint_wrapper(
                    child, preserve_rng_state=preserve_rng_state, backend=backend
                )
            setattr(parent, leaf, wrapper)
        return list(self.decisions)

    def _check_root(self, model: nn.Module) -> None:
        """Raise ``ValueError`` unless the root's decision can be carried out on ``model``."""
        if self.decisions[""] != FULL:
            raise ValueError(
                f"checkpointing: this plan says {self.decisions['']!r} for the model itself "
                "(the root module, named ''); the root can only be checkpointed whole "
                "('checkpoint'). Use a plan made by plan_checkpointing."
            )
        if root_checkpointed(model):
            raise ValueError(
                "checkpointing: the model itself is already checkpointed whole; apply a "
                "plan to a model without checkpoint wrappers."
            )

    def __str__(self) -> str:
        header = ("module", "grain", "activations kept", "recompute", "decision")
        lines = [
            (
                row.module or "(the model)",
                row.kind,
                _mib(row.kept_bytes),
                f"{row.recompute_seconds * 1e3:.2f} ms",
                row.decision,
            )
            for row in self.rows
        ]
        widths = [max(len(cell) for cell in column) for column in zip(header, *lines, strict=True)]
        rendered = [
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
            for line in (header, tuple("-" * width for width in widths), *lines)
        ]
        fraction = self.estimated_bytes / max(self.plain_bytes, 1)
        rendered.append(
            f"activations: {_mib(self.estimated_bytes)} of {_mib(self.plain_bytes)} plain "
            f"({fraction:.2f}x; budget {_mib(self.budget_bytes)}); step time "
            f"{self.estimated_step_time_ratio:.2f}x the plain {self.step_seconds * 1e3:.1f} ms"
        )
        if self.device_bytes is not None:
            peak = _mib(self.device_peak_bytes or 0)
            rendered.append(
                f"device memory while planning (the device's statistics): peak {peak} "
                f"above what was allocated before, {_mib(self.device_bytes)} left after"
            )
        if self.note:
            rendered.append(self.note)
        return "\n".join(rendered)
