"""``CheckpointPlan``: which module calls to checkpoint, at which grain, and what it costs.

A plan is data: it prints as a table, saves to a readable JSON file
(:meth:`CheckpointPlan.save`, :meth:`CheckpointPlan.load`) and carries itself out on a
model built the same way (:meth:`CheckpointPlan.apply`), which it checks first: the
same modules and parameter shapes, and, where given, inputs of the same shapes.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from accel import Accelerator

from .._decisions import CHOSEN, SAVED
from .._saved_plan import SavedPlan
from ._cost import DeviceRates
from ._grains import Decision, decode_decision, encode_decision
from ._measure_step import PlanMeasurement, measure_plan
from ._plan_apply import apply_decisions
from ._signature import check_inputs, check_model
from ._store import PlanFormatError

__all__ = ["FORMAT", "FORMATS", "CheckpointPlan", "ConsideredPlan", "PlanRow"]

FORMAT = "accel.checkpoint-plan/2"
#: The plan file formats this release reads: ``/2`` holds one tagged decision per
#: module call; ``/1`` (written before the grains were strategies) held the grains'
#: names, the chosen calls and the saved plans in three parallel mappings.
FORMATS = (FORMAT, "accel.checkpoint-plan/1")
#: Where a ``/1`` file kept each grain's payload.
_V1_PAYLOADS = {CHOSEN: "kept_calls", SAVED: "saved_plans"}


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
    fits: bool  # estimated bytes within the budget
    taken: bool
    reason: str = ""  # why it was taken or not
    # Recompute time with each grain's margin, as the search weighed it (None in plans
    # saved before margins were used).
    weighed_seconds: float | None = None


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _mib(count: int) -> str:
    return f"{count / 2**20:.2f} MiB"


@dataclass(frozen=True)
class CheckpointPlan:
    """What :func:`plan_checkpointing` decided, and what it expects that to cost.

    Printing a plan shows one row per module call considered (the activation bytes it
    keeps under the decision, the estimated time to recompute it in backward, and the
    decision) and the totals. A module called several times per step (a shared layer)
    has one row per call, named ``"name@k"`` for its k-th call.

    Attributes:
        choices: Module call to its :class:`Decision`, in visiting order: the grain's
            name, ``"checkpoint"`` (whole module), ``"recompute cheap ops"`` (selective
            by operator class), ``"recompute cheap ops, every second mm"`` (the same
            with torchtitan's rule), ``"keep costly ops"`` (selective by chosen calls,
            with the kept calls as payload) or ``"recompute saved"`` (saved-tensor
            grain, with its ``SavedPlan``). A name is a module's qualified name, or
            ``"name@k"`` for the k-th call of a module called several times per step.
            :attr:`decisions`, :attr:`kept_calls` and :attr:`saved_plans` are read-only
            views of it.
        rows: The table's rows.
        plain_bytes: Activation bytes of the plain model (autograd-saved storages).
        estimated_bytes: Activation bytes expected under the plan.
        compiled_estimated_bytes: Activation bytes expected under the plan once the
            model is compiled (``torch.compile``): each saved-tensor-grain call in its
            compiled form, plus the generator state a compiled region keeps for each
            random draw it recomputes (the note says when this is above
            :attr:`estimated_bytes`). ``None`` in plans saved before it was recorded.
        estimated_step_time_ratio: Expected step time over the plain step time.
        budget_bytes: The budget the plan was made for, in bytes.
        step_seconds: The plain step's estimated seconds (forward and backward), from
            the cost model and ``rates``.
        rates: The device rates the estimates come from (:class:`DeviceRates`).
        structure: The planned model's modules and parameter shapes
            (:func:`structure_of`), checked by :meth:`apply`.
        inputs: The example inputs' shapes and dtypes, checked by :meth:`apply` when it
            is given inputs.
        calls: For each module called several times per step, how many times.
        enclosed: For each planned call that makes calls of a module in ``calls``, those
            calls by module (they run inside its region and are not counted; empty in
            plans saved before it was recorded, whose inner calls are counted).
        device_peak_bytes: The device's peak allocation while planning
            (``max_memory_allocated``), above what was allocated before, or ``None``
            where the backend keeps no memory statistics.
        device_bytes: Memory planning left allocated on the device (0 unless
            something leaked), or ``None`` where the backend keeps no statistics.
        note: How the step was profiled where it was not on fake tensors, why a grain
            was unavailable, or empty.
        considered: The whole-model plans weighed, and why each was or was not taken.
        margins: The relative margin the search added to each grain's estimate
            (decision to margin, :data:`GRAIN_MARGINS`); empty in plans saved before
            margins were used.
    """

    choices: dict[str, Decision]
    rows: tuple[PlanRow, ...]
    plain_bytes: int
    estimated_bytes: int
    estimated_step_time_ratio: float
    budget_bytes: int
    step_seconds: float
    rates: DeviceRates | None = None
    structure: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()
    calls: dict[str, int] = field(default_factory=dict)
    enclosed: dict[str, dict[str, tuple[int, ...]]] = field(default_factory=dict)
    device_bytes: int | None = None
    device_peak_bytes: int | None = None
    note: str = ""
    considered: tuple[ConsideredPlan, ...] = ()
    margins: dict[str, float] = field(default_factory=dict)
    compiled_estimated_bytes: int | None = None

    @property
    def decisions(self) -> dict[str, str]:
        """Module call to its grain's name (a read-only view of :attr:`choices`)."""
        return {name: decision.grain for name, decision in self.choices.items()}

    @property
    def kept_calls(self) -> dict[str, tuple[tuple[str, int], ...]]:
        """For each ``"keep costly ops"`` call, its kept ``(operator, occurrence)`` calls.

        A read-only view of :attr:`choices`' payloads.
        """
        return {n: d.payload for n, d in self.choices.items() if d.grain == CHOSEN}

    @property
    def saved_plans(self) -> dict[str, SavedPlan]:
        """For each ``"recompute saved"`` call, what becomes of each of its saved tensors.

        A read-only view of :attr:`choices`' payloads.
        """
        return {n: d.payload for n, d in self.choices.items() if d.grain == SAVED}

    def check(self, model: nn.Module, example_inputs: Any = None) -> None:
        """Raise ``ValueError`` unless ``model`` (and ``example_inputs``) match the plan's.

        Args:
            model: The model the plan is to be applied to, not yet checkpointed.
            example_inputs: Inputs of a training step (a tuple or a dict), or ``None``
                to check the model alone.

        Raises:
            ValueError: Naming the first module, parameter or input that differs.
        """
        if self.structure:
            check_model(self.structure, model)
        if example_inputs is not None and self.inputs:
            check_inputs(self.inputs, example_inputs)

    def apply(
        self,
        model: nn.Module,
        *,
        example_inputs: Any = None,
        preserve_rng_state: bool = True,
        backend: Accelerator | None = None,
    ) -> list[str]:
        """Wrap, in place, the modules of ``model`` the plan checkpoints.

        ``model`` is the planned model or one built the same way (the same modules and
        parameter shapes: checked first, see :meth:`check`). The root (name ``""``,
        decided where the model's own operators save activations) is checkpointed whole
        by setting ``model.forward`` to a checkpoint around the class's forward; the
        model stays the same object. A module with decisions per call is wrapped in a
        :class:`PerCallWrapper`. A transformers ``config.use_cache`` that is ``True``
        is set to ``False``, with a warning (recomputation would append to the KV cache
        twice).

        Args:
            model: The model to checkpoint.
            example_inputs: Optionally, inputs of a training step: refused unless shaped
                like the planned ones.
            preserve_rng_state: Replay the generator states in recomputation.
            backend: The backend; ``None`` means :func:`accel.get_backend` at each call.

        Returns:
            The plan's decided names (module calls), in order.

        Raises:
            ValueError: If ``model`` or ``example_inputs`` differ from the planned ones,
                ``model`` lacks a module the plan names, or it is already wrapped.
        """
        self.check(model, example_inputs)
        apply_decisions(self.choices, self.calls, model, preserve_rng_state, backend, self.enclosed)
        return list(self.choices)

    def measure(
        self,
        model: nn.Module,
        example_inputs: Any,
        *,
        timed: bool = False,
        backend: Accelerator | str | None = None,
    ) -> PlanMeasurement:
        """Run one training step of ``model`` under this plan and report what it held.

        Run it once on a new device: the plan's figures come from fake tensors, this is
        the device's own count (see :class:`PlanMeasurement`). ``model`` is the model the
        plan was applied to; one it was not applied to is refused. Parameters,
        gradients, buffers and generator states are put back, also after an exception.
        A step over the budget by more than 2% of the plain bytes warns with figures.

        Args:
            model: The model, with this plan applied (:meth:`apply`).
            example_inputs: Inputs of a training step, shaped like the planned ones.
            timed: Also time the step against the plain step (the wrappers taken off,
                which holds the plain step's activations): one untimed round of each,
                then three alternating timed rounds, medians compared. Off by default.
            backend: The backend or its name; ``None`` means :func:`accel.get_backend`.

        Returns:
            The measured activation bytes beside the plan's estimate, budget and plain
            bytes; with ``timed``, the step time ratio beside the estimated one.

        Raises:
            ValueError: If ``model`` or ``example_inputs`` differ from the planned ones,
                or the plan was not applied to ``model``.
        """
        return measure_plan(self, model, example_inputs, timed=timed, backend=backend)

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
            f"{self.estimated_step_time_ratio:.2f}x the plain step's, estimated at "
            f"{self.step_seconds * 1e3:.1f} ms"
            + (
                ""
                if self.rates is None
                else f" ({self.rates.source} {self.rates.device_type} rates)"
            )
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

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON values (what :meth:`save` writes)."""
        return {
            "format": FORMAT,
            "decisions": {name: encode_decision(d) for name, d in self.choices.items()},
            "rows": [list(row.__dict__.values()) for row in self.rows],
            "plain_bytes": self.plain_bytes,
            "estimated_bytes": self.estimated_bytes,
            "estimated_step_time_ratio": self.estimated_step_time_ratio,
            "budget_bytes": self.budget_bytes,
            "step_seconds": self.step_seconds,
            "rates": None if self.rates is None else self.rates.to_dict(),
            "structure": list(self.structure),
            "structure_sha256": _digest(self.structure),
            "inputs": list(self.inputs),
            "calls": dict(self.calls),
            "enclosed": {
                name: {module: list(calls) for module, calls in inner.items()}
                for name, inner in self.enclosed.items()
            },
            "note": self.note,
            "considered": [list(c.__dict__.values()) for c in self.considered],
            "margins": dict(self.margins),
            "compiled_estimated_bytes": self.compiled_estimated_bytes,
        }

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> CheckpointPlan:
        """A plan from :meth:`to_dict`'s form, of a format in :data:`FORMATS`.

        A ``/1`` plan (three parallel mappings) is read as one tagged decision per call.

        Raises:
            ValueError: If ``value`` is not a saved plan of a format this release reads.
        """
        if not isinstance(value, dict) or value.get("format") not in FORMATS:
            found = value.get("format") if isinstance(value, dict) else type(value).__name__
            raise PlanFormatError(
                f"checkpointing: this is not a saved checkpoint plan of format "
                f"{' or '.join(map(repr, FORMATS))} (found {found!r}). Load a file that "
                "CheckpointPlan.save wrote, or plan again with plan_checkpointing and save "
                "that plan."
            )
        try:
            return cls(
                choices=_choices(value),
                rows=tuple(PlanRow(*row) for row in value["rows"]),
                plain_bytes=int(value["plain_bytes"]),
                estimated_bytes=int(value["estimated_bytes"]),
                estimated_step_time_ratio=float(value["estimated_step_time_ratio"]),
                budget_bytes=int(value["budget_bytes"]),
                step_seconds=float(value["step_seconds"]),
                rates=None if value["rates"] is None else DeviceRates.from_dict(value["rates"]),
                structure=tuple(value["structure"]),
                inputs=tuple(value["inputs"]),
                calls={k: int(v) for k, v in value["calls"].items()},
                # Absent from plans saved before enclosed calls were recorded.
                enclosed={
                    str(name): {str(m): tuple(int(c) for c in calls) for m, calls in inner.items()}
                    for name, inner in value.get("enclosed", {}).items()
                },
                note=str(value["note"]),
                considered=tuple(ConsideredPlan(*c) for c in value["considered"]),
                # Absent from plans saved before the search weighed margins.
                margins={k: float(v) for k, v in value.get("margins", {}).items()},
                # Absent from plans saved before the compiled estimate was recorded.
                compiled_estimated_bytes=_optional_int(value.get("compiled_estimated_bytes")),
            )
        except (KeyError, TypeError, AttributeError, ValueError) as error:
            raise PlanFormatError(
                f"checkpointing: this saved plan is incomplete or damaged ({error!r} is "
                "missing or of the wrong type). Save the plan again with CheckpointPlan.save."
            ) from None

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the plan to ``path`` as indented JSON (readable, diffable).

        Args:
            path: The file to write.
        """
        text = json.dumps(self.to_dict(), indent=1, sort_keys=False)
        Path(path).write_text(text + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CheckpointPlan:
        """Read a plan :meth:`save` wrote.

        Args:
            path: The file to read.

        Returns:
            The plan, ready to :meth:`apply` to a model built like the planned one.

        Raises:
            ValueError: If the file is not a saved plan of this format.
        """
        try:
            value = json.loads(Path(path).read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise PlanFormatError(
                f"checkpointing: {os.fspath(path)!r} is not JSON ({error}). Load a file "
                "that CheckpointPlan.save wrote."
            ) from None
        return cls.from_dict(value)


def _choices(value: dict[str, Any]) -> dict[str, Decision]:
    """The tagged decisions of a saved plan, of format ``/2`` or ``/1``."""
    if value["format"] == FORMAT:
        return {
            name: decode_decision(str(entry["grain"]), entry.get("payload"))
            for name, entry in value["decisions"].items()
        }
    payloads = {grain: value[key] for grain, key in _V1_PAYLOADS.items()}
    return {
        name: decode_decision(grain, payloads.get(grain, {}).get(name))
        for name, grain in value["decisions"].items()
    }


def _digest(lines: tuple[str, ...]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()
