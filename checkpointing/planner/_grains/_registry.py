"""The registry of grains, and what the planner and the plan ask of it.

:data:`GRAINS` lists the grains in the order their options are built for a module call
(which the search's plans by hand, "every block at one option", follow). Adding a grain
is writing its module and adding its instance here (see :class:`Grain`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .._offload_settings import OffloadSettings
from .._options import Call, Option, is_candidate
from .._records import StepProfile
from ._base import Decision, Grain
from ._chosen import CHOSEN_CALLS
from ._keep import KEPT
from ._offloaded import OFFLOAD
from ._operator_class import EVERY_SECOND_MM, OPERATOR_CLASS
from ._saved import SAVED_TENSORS
from ._whole import WHOLE

__all__ = [
    "GRAINS",
    "candidates",
    "coarseness_order",
    "compiled_forms",
    "decode_decision",
    "encode_decision",
    "grain_named",
    "margins",
    "options_of",
]

GRAINS: tuple[Grain[Any], ...] = (
    WHOLE,
    SAVED_TENSORS,
    OPERATOR_CLASS,
    EVERY_SECOND_MM,
    CHOSEN_CALLS,
    KEPT,
    OFFLOAD,
)


def grain_named(name: str) -> Grain[Any] | None:
    """The registered grain named ``name``, or ``None`` (a decision of another release)."""
    return next((grain for grain in GRAINS if grain.name == name), None)


def _searched() -> list[Grain[Any]]:
    ranked = [grain for grain in GRAINS if grain.coarseness is not None]
    return sorted(ranked, key=lambda grain: grain.coarseness or 0)


def coarseness_order() -> tuple[str, ...]:
    """The names of the grains the search weighs, coarsest first: the order of a tie."""
    return tuple(grain.name for grain in _searched())


def margins() -> dict[str, float]:
    """Each searched grain's margin, by name (a plan records them)."""
    return {grain.name: grain.margin for grain in _searched()}


def compiled_forms() -> tuple[str, ...]:
    """The grains that may stand in for an untraceable one under ``torch.compile``."""
    return tuple(grain.name for grain in GRAINS if grain.compiled_form)


def options_of(call: Call, selective: bool) -> list[Option]:
    """Every registered grain's options for ``call``, in registry order.

    A grain is asked only where it applies (see :class:`Grain`'s ``fine``, ``recorded``
    and ``selective``): the root and RNNs get whole-call grains only, a call whose data
    decides its shapes gets no grain that relies on recorded occurrences, and selective
    grains need ``selective`` and a call without batch norm's running statistics. Each
    option is priced with its grain's own cost per call (``call_cost``) and per tensor
    the call saves (``tensor_cost``).
    """
    record = call.record
    whole_only = not call.name or record.fused_rnn
    found: list[Option] = []
    for grain in GRAINS:
        if (
            (grain.fine and whole_only)
            or (grain.recorded and (record.data_dependent or record.unlike_real))
            or (grain.selective and (not selective or record.running_stats))
        ):
            continue
        options = grain.options(call)
        own = _own_cost(grain, call)
        if own:
            options = [replace(option, seconds=option.seconds + own) for option in options]
        found.extend(options)
    return found


def _own_cost(grain: Grain[Any], call: Call) -> float:
    """What ``grain``'s wrapper costs on ``call``: once a call, and once a saved tensor."""
    rates = call.profile.rates
    own = getattr(rates, grain.call_cost) if grain.call_cost is not None else 0.0
    if grain.tensor_cost is not None:
        own += len(call.record.packs) * getattr(rates, grain.tensor_cost)
    return float(own)


def candidates(
    profile: StepProfile, selective: bool, offload: OffloadSettings | None = None
) -> dict[str, list[Option]]:
    """Every candidate module call's options (:func:`is_candidate`).

    ``offload`` holds the offload grain's settings, where the planner was asked for it.
    """
    return {
        name: options_of(Call.of(profile, name, offload), selective)
        for name in profile.modules
        if is_candidate(profile, name)
    }


def encode_decision(decision: Decision) -> dict[str, Any]:
    """``decision`` as a plan file writes it: ``{"grain": name}``, and its ``"payload"``.

    A decision of a grain this release does not know keeps its payload as it was read.
    """
    grain = grain_named(decision.grain)
    payload = (
        decision.payload
        if grain is None or decision.payload is None
        else grain.encode(decision.payload)
    )
    entry: dict[str, Any] = {"grain": decision.grain}
    if payload is not None:
        entry["payload"] = payload
    return entry


def decode_decision(grain_name: str, payload: Any) -> Decision:
    """The :class:`Decision` of ``grain_name`` with its file ``payload`` (``None``: none).

    A grain this release does not know is kept with its payload as written: applying
    the plan refuses it with a sentence.
    """
    grain = grain_named(grain_name)
    if grain is None or payload is None:
        return Decision(grain_name, payload)
    return Decision(grain_name, grain.decode(payload))
