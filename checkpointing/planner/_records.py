"""What the profile records: module calls, their operator calls, and the step as a whole.

:func:`._profile.profile_step` fills in a :class:`RecordedStep` from one step on fake
tensors: per operator call what it computes and moves (:class:`._work.OpWork`), and no
rate. The cost pass (:func:`._pricing.cost`) prices it at a device's rates into a
:class:`StepProfile`, which every later stage of the planner (options, search, plan)
reads. Storages are numbered (an ``int`` index per storage the step creates or
receives), never held.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .._replay import Geometry
from ._cost import DeviceRates
from ._work import OpWork

__all__ = [
    "ModuleProfile",
    "OpCall",
    "RecordedStep",
    "StepProfile",
    "call_name",
    "module_name",
    "parse_call",
]


@dataclass
class OpCall:
    """One operator call inside a module's forward, as a selective policy sees it.

    ``occurrence`` counts the earlier calls of the same operator in that module call's
    forward, which is how a policy recognises the call again. ``work`` is what the call
    computes and moves; ``seconds``, the cost model's estimate of the operator alone, is
    filled in by the cost pass (0 in a :class:`RecordedStep`).
    """

    name: str
    occurrence: int
    seconds: float
    fresh: tuple[int, ...]
    mutated: tuple[int, ...]
    read: tuple[int, ...]
    random: bool
    func: Any = None
    template: Any = None  # (args, kwargs) with tensors as Refs; None if not replayable
    outputs: tuple[int | None, ...] = ()  # each output tensor's new storage, or None
    work: OpWork | None = None  # None only in calls made up by hand (tests)
    kept: bool = False  # a selective checkpoint keeps its output (not recomputed)


@dataclass
class ModuleProfile:
    """What one module call's forward saved, took and received.

    ``forward_time`` and ``recomputed_time`` (its operators' seconds, and those of the
    ones a selective checkpoint recomputes) are filled in by the cost pass (0 in a
    :class:`RecordedStep`).
    """

    name: str
    kind: str = ""
    module: str = ""  # the module's qualified name (``name`` less any ``@k``)
    call: int = 0  # which call of the module this is (0 for the first)
    calls: int = 1  # how many calls of the module the step makes
    running_stats: bool = False  # it or a module inside updates running statistics
    data_dependent: bool = False  # an operator inside has a data-dependent output shape
    unlike_real: bool = False  # a real forward calls it (or one inside) on other inputs
    aligned: tuple[str, ...] = ()  # arguments passed as None, as the real forward does
    fused_rnn: bool = False  # an nn.RNNBase (LSTM, GRU, RNN): one fused kernel per layer
    children: list[str] = field(default_factory=list)  # the calls made inside this one
    child_kinds: tuple[str, ...] = ()  # the module's own children's classes
    inputs: set[int] = field(default_factory=set)
    cached: set[int] = field(default_factory=set)
    forward_time: float = 0.0
    recomputed_time: float = 0.0
    ops: list[OpCall] = field(default_factory=list)
    packs: list[tuple[int | None, Geometry]] = field(default_factory=list)
    input_order: list[int | None] = field(default_factory=list)
    input_shapes: tuple[tuple[int, ...], ...] = ()  # each tensor input's shape
    grads: tuple[bool, ...] = ()  # requires_grad of each tensor input, then each parameter
    assigns: tuple[str, ...] = ()  # attributes its forward rebound on its module (a state)


class _PlainBytes:
    """What a recorded step and a priced one share: the plain step's saved bytes."""

    storage_bytes: dict[int, int]
    saved_by: dict[int, set[tuple[str, ...]]]

    @property
    def plain_bytes(self) -> int:
        """Bytes of the distinct storages autograd keeps in the plain step."""
        return sum(self.storage_bytes[index] for index in self.saved_by)


@dataclass(frozen=True)
class RecordedStep(_PlainBytes):
    """One recorded training step, with no rate in it: what a plan is priced from.

    :func:`checkpointing.profile_step` returns it; pass it to
    :func:`checkpointing.plan_checkpointing` (``profile=``) to plan the same model and
    inputs again, at other rates or budgets, without profiling again.

    Attributes:
        modules: Each module call's record, by name (``"name@k"`` for repeated calls).
        storage_bytes: Bytes of each storage, by index.
        saved_by: For each storage autograd saves, the stacks of module calls that saved it.
        forward: Every operator call of the forward, in order (those outside any module
            call included).
        backward: Every operator call of the backward, in order (empty where the step
            ran on real tensors: its backward is then estimated from the forward's calls,
            :func:`._pricing.backward_seconds`).
        fallback: Why the step ran on real tensors, or empty.
        host_masks: Random draws land in host memory (dropout masks packable).
        structure: The profiled model's structure (:func:`._signature.structure_of`).
        inputs: Its inputs' shapes and dtypes (:func:`._signature.inputs_of`).
        grads: Whether each parameter, then each tensor input, required grad (which
            decides what autograd saves).
        device_type: The device type of the backend it was profiled for.
    """

    modules: dict[str, ModuleProfile]
    storage_bytes: dict[int, int]
    saved_by: dict[int, set[tuple[str, ...]]]
    forward: tuple[OpWork, ...]
    backward: tuple[OpWork, ...]
    fallback: str = ""
    host_masks: bool = False
    structure: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()
    grads: tuple[bool, ...] = ()
    device_type: str = ""

    @property
    def unlike_real(self) -> tuple[str, ...]:
        """The calls a real forward gives other inputs, and their callers, sorted.

        Each record's ``unlike_real`` (:mod:`._real_calls`), gathered.
        """
        return tuple(sorted(name for name, record in self.modules.items() if record.unlike_real))

    @property
    def aligned(self) -> dict[str, tuple[str, ...]]:
        """The calls profiled with the real forward's ``None`` arguments, and which."""
        return {name: record.aligned for name, record in self.modules.items() if record.aligned}


@dataclass
class StepProfile(_PlainBytes):
    """The recorded step priced at rates: storages, who saved them, and estimated seconds."""

    modules: dict[str, ModuleProfile]
    storage_bytes: dict[int, int]
    saved_by: dict[int, set[tuple[str, ...]]]
    step_time: float  # the plain step's estimated seconds (forward and backward)
    forward_time: float
    rates: DeviceRates
    fallback: str = ""  # why the step ran on real tensors, or empty
    host_masks: bool = False  # random draws land in host memory (dropout masks packable)


def call_name(module: str, call: int, calls: int) -> str:
    """A module call's record name: ``module`` if called once, else ``module@call``."""
    return module if calls == 1 else f"{module}@{call}"


def parse_call(name: str) -> tuple[str, int]:
    """A record name split into the module's name and the call (``"a@2"``: a, 2)."""
    if "@" not in name:
        return name, 0
    module, _, call = name.rpartition("@")
    return module, int(call)


def module_name(name: str) -> str:
    """The qualified module name of a record name (``"layer@2"`` -> ``"layer"``)."""
    return parse_call(name)[0]
