"""The grain protocol: one way to checkpoint a module call, as one named strategy.

A grain is everything the planner and a plan need to know about one decision: its name
(the value in the plan's table and file), the options it offers for a module call, what
a plan keeps for it (its payload), how that payload is checked, written and read, the
wrapper that carries it out, and how the search weighs it. The registry
(:mod:`._registry`) lists the grains; the planner, the plan and its file ask the grain
named in a decision and know nothing else about it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from torch import nn

from accel import Accelerator

from .._options import Call, Option
from .._records import StepProfile

__all__ = ["Decision", "Grain", "PayloadFree"]

P = TypeVar("P")


@dataclass(frozen=True)
class Decision:
    """What a plan does with one module call: a grain's name and that grain's payload.

    Attributes:
        grain: The grain's name, as the plan's table shows it (``"checkpoint"``,
            ``"recompute cheap ops"``, ``"keep costly ops"``, ``"recompute saved"``...).
        payload: What the grain needs to carry the decision out: ``None`` for a whole
            module or an operator class, the kept ``(operator, occurrence)`` calls for
            ``"keep costly ops"``, a ``SavedPlan`` for ``"recompute saved"``.
    """

    grain: str
    payload: Any = None


class Grain(ABC, Generic[P]):
    """One grain of checkpointing: a named strategy with a payload of type ``P``.

    How a grain is added (the offload grain is the next): write one module with a
    subclass that sets the class attributes below and implements the methods, and add
    its instance to ``GRAINS`` in :mod:`._registry`. Nothing else changes: the search
    weighs its options with its margin and coarseness, the plan validates, wraps, writes
    and reads its decisions through it, and the other grains stay as they are.

    Attributes:
        name: The decision's name in the plan's table and file. A saved file holds it:
            once released, it never changes.
        coarseness: Its place in the search's tie-break order, coarsest (its cost best
            known) first; ``None`` for a grain that offers the search no option.
        margin: How far, relative to its estimate, its recompute time may be off beyond
            the operators' rates (the search weighs ``seconds * (1 + margin)``).
        fine: It works inside a module's operators, so it is not offered to the root
            (checkpointed whole, by setting its ``forward``) nor to an RNN (whose layers
            are fused kernels that return a workspace beside their outputs and differ
            between backends).
        recorded: It relies on recorded positions or operator occurrences, which do not
            hold in another step where the data decides shapes or how many calls run
            (mixture-of-experts routing): not offered there.
        selective: It runs torch's selective checkpoint, which needs torch 2.5 and the
            planner's ``selective=True``, and fails around batch norm in training (the
            recomputation gives it fresh running-statistics buffers, a call the policy
            never saw in the forward): not offered there.
        compiled_form: Under ``torch.compile`` it may stand in for a grain whose
            wrapper cannot be traced (:mod:`.._compiled`).
        traceable: Its wrapper can be traced by ``torch.compile``; if not, the plan
            gives each such call a compiled form (:meth:`compiled_as`).
        call_cost: The :class:`DeviceRates` field its wrapper costs once per module
            call, beyond the operators its options price (``"region_seconds"`` for a
            checkpoint, ``"saved_call_seconds"`` for the saved-tensor grain);
            :func:`._registry.options_of` adds it to every option; ``None``: nothing.
        tensor_cost: The :class:`DeviceRates` field its wrapper costs per tensor the
            module call's forward saves (``"region_tensor_seconds"`` for a checkpoint,
            whose hooks see every saved tensor); added likewise; ``None``: nothing.
    """

    name: str
    coarseness: int | None = None
    margin: float = 0.0
    fine: bool = True
    recorded: bool = False
    selective: bool = False
    compiled_form: bool = False
    traceable: bool = True
    call_cost: str | None = None
    tensor_cost: str | None = None

    @abstractmethod
    def options(self, call: Call) -> list[Option]:
        """Its ways to checkpoint ``call``, each an :class:`Option` named :attr:`name`."""

    @abstractmethod
    def payload(self, profile: StepProfile, name: str, option: Option) -> P:
        """What a plan that takes ``option`` for module call ``name`` keeps."""

    @abstractmethod
    def check(self, name: str, payload: object) -> P:
        """``payload``, checked: raise ``ValueError`` naming ``name`` unless it is one."""

    @abstractmethod
    def wrapper(
        self,
        module: nn.Module,
        payload: P,
        *,
        name: str,
        preserve_rng_state: bool,
        backend: Accelerator | None,
    ) -> nn.Module:
        """``module`` as the decision runs it (the module itself where nothing changes)."""

    @abstractmethod
    def encode(self, payload: P) -> Any:
        """``payload`` as JSON values (``None`` for none)."""

    @abstractmethod
    def decode(self, value: Any) -> P:
        """The inverse of :meth:`encode` (``value`` is never ``None``)."""

    def compiled_as(self, payload: P, form: str) -> P:
        """``payload`` recording the grain ``form`` it runs as under ``torch.compile``.

        Only a grain that is not :attr:`traceable` gets a compiled form and implements it.
        """
        raise NotImplementedError(
            f"checkpointing: the {self.name!r} grain is traceable and has no compiled form."
        )


class PayloadFree(Grain[None]):
    """A grain whose decision needs nothing beyond its name (whole module, operator class)."""

    def payload(self, profile: StepProfile, name: str, option: Option) -> None:
        """Nothing."""
        return None

    def check(self, name: str, payload: object) -> None:
        """Raise ``ValueError`` unless ``payload`` is ``None``."""
        if payload is not None:
            raise ValueError(
                f"checkpointing: this plan gives {name!r} ({self.name!r}) a payload "
                f"({type(payload).__name__}), which that grain does not take. Use a plan "
                "made by plan_checkpointing, or give the decision no payload."
            )

    def encode(self, payload: None) -> Any:
        """Nothing (``None``)."""
        return None

    def decode(self, value: Any) -> None:
        """Refuse ``value``: a payload-free grain's decisions have no payload in a file."""
        raise TypeError(f"a {self.name!r} decision with a payload")
