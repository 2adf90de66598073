"""What the saved-tensor grain does to one module's saved tensors: a :class:`SavedPlan`.

The planner (:mod:`checkpointing.planner`) decides it; :class:`._saved_wrapper.
SavedTensorWrapper` carries it out. Each saved tensor is known by its position among
the tensors the module's forward saves: it is *dropped* (recomputed in backward by
running its recorded :class:`ReplayStep` calls again), *packed* (a host dropout mask
stored as booleans, :mod:`._packed`) or kept as a *leaf* that a recipe reads.
Under ``torch.compile``, where saved-tensor hooks cannot be traced, the module runs as
the region the plan names instead (``compiled_as``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ._decisions import FULL
from ._replay import Geometry

__all__ = ["DROP", "LEAF", "PACK", "ReplayStep", "SavedPlan", "grad_pattern", "operator_named"]

DROP, PACK, LEAF = "drop", "pack", "leaf"


def operator_named(name: str) -> Any:
    """The aten operator overload named ``name`` (``"aten.mul.Tensor"``).

    Raises:
        AttributeError: If this torch has no such operator.
    """
    namespace, _, rest = name.partition(".")
    packet, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload or "default")


def grad_pattern(module: nn.Module, inputs: list[torch.Tensor]) -> tuple[bool, ...]:
    """Which of a call's tensor inputs, then which of ``module``'s parameters, need grad.

    Autograd saves other tensors when it changes (a linear layer whose input needs
    grad also saves its weight), so a :class:`SavedPlan` holds only for the pattern
    it was made with.
    """
    return (*(t.requires_grad for t in inputs), *(p.requires_grad for p in module.parameters()))


@dataclass(frozen=True)
class ReplayStep:
    """One recorded operator call a dropped tensor's recipe runs again.

    Attributes:
        name: The operator's name (``"aten.mul.Tensor"``).
        func: The operator itself.
        template: Its ``(args, kwargs)``, each tensor replaced by a :class:`._replay.Ref`.
        outputs: For each tensor it returns, the storage it stands for (``None``: not
            needed again).
    """

    name: str
    func: Any
    template: Any
    outputs: tuple[int | None, ...]

    def __reduce__(self) -> tuple[Any, ...]:
        # An operator overload cannot be pickled; its name can (a wrapped model pickles).
        return (_replay_step, (self.name, self.template, self.outputs))


def _replay_step(name: str, template: Any, outputs: tuple[int | None, ...]) -> ReplayStep:
    return ReplayStep(name, operator_named(name), template, outputs)


@dataclass(frozen=True)
class SavedPlan:
    """What one module's saved tensors become, by their position in its forward.

    Attributes:
        module: The module's qualified name, for messages.
        positions: Pack position (the n-th tensor autograd saves in the module's
            forward) to ``(action, storage)``; ``action`` is ``"drop"``, ``"pack"`` or
            ``"leaf"`` (kept, and read by a recipe).
        geometries: The view each planned position saves, checked in the forward.
        recipes: Dropped storage to the calls that recompute it, in forward order.
        inputs: Storage to its position among the module's flattened tensor inputs.
        summary: What the plan drops and packs, for the plan's table.
        grads: The :func:`grad_pattern` of the profiled call (``None``: not recorded).
        compiled_as: What the module runs as under ``torch.compile``: ``"checkpoint"``
            (a whole-module region), ``"recompute cheap ops"`` (a selective region by
            operator class) or ``"keep"`` (as it is), chosen by the planner so that the
            plan's estimate holds (:mod:`checkpointing.planner._compiled`).
        input_shapes: The shape of each tensor input of the profiled call (``None``:
            not recorded).
    """

    module: str
    positions: dict[int, tuple[str, int]]
    geometries: dict[int, Geometry]
    recipes: dict[int, tuple[ReplayStep, ...]]
    inputs: dict[int, int]
    summary: str = ""
    grads: tuple[bool, ...] | None = None
    compiled_as: str = FULL
    input_shapes: tuple[tuple[int, ...], ...] | None = None

    @property
    def state_prefix(self) -> str:
        """What qualified parameter and buffer names start with inside the module."""
        return f"{self.module}."
