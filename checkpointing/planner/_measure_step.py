"""``CheckpointPlan.measure``: one real step of a planned model, against the plan's figures.

The plan's figures come from a profile on fake tensors and a cost model; on a device the
planner has not met they may be off. :func:`measure_plan` runs one training step of the
model the plan was applied to, on its device, and reports the activation bytes it held
(what ``benchmarks/bench_budget.py`` counts: :func:`checkpointing._measure.held_bytes`)
beside the plan's estimate, budget and plain bytes. It warns when the step holds more
than the budget plus 2% of the plain step's bytes. Timing is on request only: it needs
the plain step as its reference, which holds the plain step's activations.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from torch import nn

import accel
from accel import Accelerator

from .._args import resolve_backend
from .._measure import LiveActivationMeter, SavedTensorMeter, held_bytes
from .._root import root_checkpointed
from .._steps import backward, call_model, tensors_of, untouched
from .._wrapper import CheckpointWrapper
from ._calibration._stopwatch import Sizes, best_times
from ._records import module_name
from ._signature import check_inputs

__all__ = ["TIMED_ROUNDS", "TOLERANCE", "PlanMeasurement", "measure_plan"]

#: How far over its budget a step may hold, as a fraction of the plain step's bytes.
TOLERANCE = 0.02
#: Timed rounds of each step (after one untimed round); the medians are compared.
TIMED_ROUNDS = 3


class _Plan(Protocol):
    """What this module reads of a :class:`CheckpointPlan` (which imports this module)."""

    @property
    def decisions(self) -> dict[str, str]: ...
    @property
    def inputs(self) -> tuple[str, ...]: ...
    @property
    def plain_bytes(self) -> int: ...
    @property
    def estimated_bytes(self) -> int: ...
    @property
    def budget_bytes(self) -> int: ...
    @property
    def estimated_step_time_ratio(self) -> float: ...


@dataclass(frozen=True)
class PlanMeasurement:
    """One real step of a planned model beside the plan's figures (:meth:`CheckpointPlan.measure`).

    Attributes:
        activation_bytes: What the planned step's forward held for backward, measured:
            the storages it created that were still alive after it (autograd's saved
            tensors, checkpoint inputs, selective caches), less its output unless
            autograd saved it, plus the inputs autograd saved.
        estimated_bytes: The plan's estimate of ``activation_bytes``.
        budget_bytes: The budget the plan was made for.
        plain_bytes: The plain step's activation bytes, as the plan's profile counted them.
        estimated_step_time_ratio: The plan's estimate of its step time over the plain
            step's.
        step_time_ratio: The planned step's measured time over the plain step's (the
            medians of :data:`TIMED_ROUNDS` rounds, the two steps alternating after one
            untimed round of each), or ``None`` unless timed.
        step_seconds: The planned step's median seconds, or ``None`` unless timed.
        plain_step_seconds: The plain step's median seconds, or ``None`` unless timed.
        measured_plain_bytes: What the plain step's forward held, measured alike, or
            ``None`` unless timed (only a timed measurement runs the plain step).
        backend: The name of the backend the step ran on.
    """

    activation_bytes: int
    estimated_bytes: int
    budget_bytes: int
    plain_bytes: int
    estimated_step_time_ratio: float
    step_time_ratio: float | None = None
    step_seconds: float | None = None
    plain_step_seconds: float | None = None
    measured_plain_bytes: int | None = None
    backend: str = ""

    @property
    def over_budget(self) -> bool:
        """Whether the step held more than the budget plus 2% of the plain bytes."""
        return self.activation_bytes > self.budget_bytes + TOLERANCE * self.plain_bytes

    @property
    def estimate_error(self) -> float:
        """``|measured - estimated|`` activation bytes, as a fraction of the plain bytes."""
        return abs(self.activation_bytes - self.estimated_bytes) / max(self.plain_bytes, 1)

    def __str__(self) -> str:
        plain = max(self.plain_bytes, 1)
        lines = [
            f"activations: {_mib(self.activation_bytes)} measured on {self.backend} "
            f"({self.activation_bytes / plain:.2f}x the plain step's {_mib(self.plain_bytes)}); "
            f"estimated {_mib(self.estimated_bytes)} ({self.estimated_bytes / plain:.2f}x), "
            f"budget {_mib(self.budget_bytes)} ({self.budget_bytes / plain:.2f}x)"
            + (": over budget" if self.over_budget else "")
        ]
        if self.step_time_ratio is not None:
            lines.append(
                f"step time: {self.step_time_ratio:.2f}x the plain step's measured "
                f"({(self.step_seconds or 0.0) * 1e3:.1f} ms against "
                f"{(self.plain_step_seconds or 0.0) * 1e3:.1f} ms), "
                f"{self.estimated_step_time_ratio:.2f}x estimated"
            )
        return "\n".join(lines)


def _mib(count: int) -> str:
    return f"{count / 2**20:.2f} MiB"


def measure_plan(
    plan: _Plan,
    model: nn.Module,
    example_inputs: Any,
    *,
    timed: bool = False,
    backend: Accelerator | str | None = None,
) -> PlanMeasurement:
    """Run one step of ``model`` under ``plan`` and compare it with the plan's figures.

    See :meth:`CheckpointPlan.measure`, which calls this.
    """
    _require_applied(plan, model)
    if plan.inputs:
        check_inputs(plan.inputs, example_inputs)
    resolved = resolve_backend(backend)
    runner = accel.get_backend() if resolved is None else resolved

    def planned() -> None:
        _step(model, example_inputs, runner)

    def plain() -> None:
        with _plain(plan, model):
            _step(model, example_inputs, runner)

    step_seconds = plain_seconds = ratio = None
    measured_plain = None
    with untouched(model, runner):
        held = _held(model, example_inputs, runner)
        if timed:
            with _plain(plan, model):
                measured_plain = _held(model, example_inputs, runner)
            plain_seconds, step_seconds = best_times(
                [plain, planned], runner, Sizes(rounds=TIMED_ROUNDS)
            )
            ratio = step_seconds / plain_seconds if plain_seconds > 0 else None
    report = PlanMeasurement(
        activation_bytes=held,
        estimated_bytes=plan.estimated_bytes,
        budget_bytes=plan.budget_bytes,
        plain_bytes=plan.plain_bytes,
        estimated_step_time_ratio=plan.estimated_step_time_ratio,
        step_time_ratio=ratio,
        step_seconds=step_seconds,
        plain_step_seconds=plain_seconds,
        measured_plain_bytes=measured_plain,
        backend=runner.name,
    )
    if report.over_budget:
        warnings.warn(
            f"checkpointing: the planned step held {_mib(held)} of activations on "
            f"{runner.name}, over its budget of {_mib(plan.budget_bytes)} by more than 2% of "
            f"the plain step's {_mib(plan.plain_bytes)} (the plan estimated "
            f"{_mib(plan.estimated_bytes)}). Plan again with a smaller budget, or report the "
            "model and runner: the planner's profile misses what this runner keeps.",
            UserWarning,
            stacklevel=3,
        )
    return report


def _require_applied(plan: _Plan, model: nn.Module) -> None:
    """Raise ``ValueError`` unless every module call the plan decides is wrapped in ``model``."""
    for name in plan.decisions:
        module = module_name(name)
        if not module:
            applied = root_checkpointed(model)
        else:
            try:
                applied = isinstance(model.get_submodule(module), CheckpointWrapper)
            except AttributeError:
                applied = False
        if not applied:
            raise ValueError(
                f"checkpointing: measure runs a model the plan was applied to, but "
                f"{module or 'the model itself'!r} is not checkpointed in this one. Call "
                "plan.apply(model) first, then plan.measure(model, example_inputs)."
            )


def _held(model: nn.Module, example_inputs: Any, backend: Accelerator) -> int:
    """The activation bytes one forward of ``model`` holds; then its backward runs."""
    exclude = [*model.parameters(), *model.buffers()]
    with LiveActivationMeter(exclude=exclude) as live, SavedTensorMeter(exclude=exclude) as saved:
        output = call_model(model, example_inputs)
    held = held_bytes(live, saved, tensors_of(output))
    backward(output)
    del output
    backend.mark_step()
    model.zero_grad(set_to_none=True)
    return held


def _step(model: nn.Module, example_inputs: Any, backend: Accelerator) -> None:
    backward(call_model(model, example_inputs))
    backend.mark_step()
    model.zero_grad(set_to_none=True)


@contextmanager
def _plain(plan: _Plan, model: nn.Module) -> Iterator[None]:
    """``model`` without the plan's wrappers while inside (put back on the way out)."""
    undo: list[tuple[Any, str, Any]] = []  # (object, attribute, value) to set back
    try:
        for module in dict.fromkeys(module_name(name) for name in plan.decisions):
            if not module:
                undo.append((model.__dict__, "forward", model.__dict__.pop("forward")))
                continue
            parent_name, _, leaf = module.rpartition(".")
            parent = model.get_submodule(parent_name)
            wrapper = parent.get_submodule(leaf)
            assert isinstance(wrapper, CheckpointWrapper)  # _require_applied checked it
            setattr(parent, leaf, wrapper.module)
            undo.append((parent, leaf, wrapper))
        yield
    finally:
        for owner, attribute, value in reversed(undo):
            if isinstance(owner, dict):
                owner[attribute] = value
            else:
                setattr(owner, attribute, value)
