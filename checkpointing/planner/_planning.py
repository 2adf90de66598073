"""``plan_checkpointing``: the fastest checkpointing that fits a memory budget.

The stages, in the order :func:`plan_checkpointing` runs them:

1. rates (:mod:`._default_rates`): the rates given, else this host's cache of
   calibrated rates (named in the plan's note), else the built-in :class:`DeviceRates`;
2. profile (:func:`._profile.profile_step`, skipped for a ``profile=`` given): one
   training step on fake tensors records, per module call, what autograd saves and every
   operator call's FLOPs and bytes (no memory, no kernel, no random draw, no rate),
   then one real forward without grad checks each call's inputs against it
   (:mod:`._real_calls`: a call a real forward gives other inputs gets no grain that
   relies on the recording);
3. cost (:func:`._pricing.cost`): the recorded step priced at the rates;
4. options (:func:`._grains.candidates`): each grain's ways to checkpoint each module
   call (the whole call, its saved tensors, its cheap operators, its chosen operator
   calls), with the bytes each keeps and the seconds it costs;
5. search (:func:`._search.search`): the combination that fits the budget in the least
   estimated time;
6. plan (:func:`_build`): the :class:`CheckpointPlan` (:mod:`._plan`), which prints,
   saves, loads and applies;
7. agree (:func:`._agree.agreed`): under ``torch.distributed`` every rank takes rank
   0's plan.

Nothing is timed, so the same model, input shapes and dtypes, budget and rates give
the same plan in any process, under any load, and on every rank.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from torch import nn

import accel
from accel import Accelerator

from .._args import resolve_backend, validate_budget, validate_planned
from .._caches import refuse_cache_inputs, switch_off_kv_cache
from .._decisions import KEEP
from .._selective import unavailable_reason
from ._agree import agreed
from ._compiled import compiled_forms, compiled_note
from ._cost import DeviceRates
from ._default_rates import host_rates
from ._enclosed import enclosed_calls
from ._grains import Decision, candidates, grain_named, margins
from ._grains._offloaded import offload_note, over_cap, without_offload
from ._offload_settings import OffloadRequest, offload_settings
from ._options import Option, storage_bytes
from ._plan import CheckpointPlan, ConsideredPlan, PlanRow
from ._pricing import cost
from ._profile import grads_of
from ._profile import profile_step as record_step
from ._real_calls import aligned_note, unlike_real_note
from ._records import RecordedStep, StepProfile
from ._search import Candidate, search
from ._signature import inputs_of, structure_of

__all__ = ["plan_checkpointing", "profile_step"]


def plan_checkpointing(
    model: nn.Module,
    example_inputs: Any,
    memory_budget: float | int,
    *,
    backend: Accelerator | str | None = None,
    selective: bool = True,
    rates: DeviceRates | None = None,
    profile: RecordedStep | None = None,
    offload_activations: bool = False,
    offload_host_bytes: int | None = None,
    parameter_reload_bytes: int = 0,
) -> CheckpointPlan:
    """Plan the checkpointing that fits ``memory_budget`` with the fastest step.

    Profiles one training step of ``model(*example_inputs)`` on fake tensors (no
    activation memory, no random number drawn; see :mod:`checkpointing.planner`),
    checks its module calls' inputs against one real forward without grad (which saves
    nothing for backward; none on a lazy device), and prices every way to checkpoint
    each module call with a cost model of FLOPs and bytes at ``rates``. Nothing is
    timed: the same model, input shapes and dtypes, budget and rates give the same plan
    in every process.
    Under an initialised ``torch.distributed`` every rank returns rank 0's plan. The
    model's parameters, gradients, buffers and generator states are left as they were.
    A transformers KV cache (``config.use_cache``) is switched off, with a warning.

    To plan the same model and inputs several times (other rates, other budgets),
    record the step once with :func:`profile_step` and pass it as ``profile=``: each
    plan then prices it and none profiles again.

    Example::

        plan = plan_checkpointing(model, (x,), memory_budget=0.5)
        print(plan)          # module, grain, activations kept, recompute, decision
        plan.apply(model)
        plan.save("plan.json")  # CheckpointPlan.load("plan.json").apply(other_model)

    Args:
        model: The model, on its device and in training mode, not yet checkpointed.
        example_inputs: A tuple of positional arguments for ``model`` (or a dict of
            keyword arguments), shaped like a training batch.
        memory_budget: Activation memory to allow: a float fraction of the plain
            model's (0 < b <= 1), or an int number of bytes.
        backend: The backend or its name; ``None`` means :func:`accel.get_backend`.
        selective: Consider operator-grain checkpointing besides whole modules: by
            operator class (recompute pointwise operators, dropout and normalisation
            inside a module; keep matmul and attention outputs), and by chosen call
            (keep the calls that save the most recompute time per byte). Unavailable
            before torch 2.5. Whole modules and the saved-tensor grain (drop saved
            tensors that cheap operators recompute from kept ones, pack host dropout
            masks) are always considered.
        rates: The device's rates for the cost model; ``None`` means those
            :func:`checkpointing.calibrate_rates` cached for this device (the plan's
            note then names the file and the rates' source), else the built-in ones
            (:func:`checkpointing.default_rates`).
        profile: A step :func:`checkpointing.profile_step` recorded for this model (the
            same parameters requiring grad), these inputs' shapes and dtypes and this
            backend's device type; ``None`` records one now. The plan is the same
            either way.
        offload_activations: Also consider the offload grain: a module call's saved
            activations wait in pinned host memory, sent on the backend's copy stream in
            forward and fetched back ahead of backward, where the copies fit the call's
            compute (see "Offloading activations" in the guide). Off by default: it
            takes pinned host memory, which the data loader, parameter offload and other
            ranks on the host share. Never offered on a host or lazy backend (the note
            says why).
        offload_host_bytes: The cap on the plan's pinned host memory; ``None``: a
            quarter of the host's total memory. Recorded in the plan.
        parameter_reload_bytes: Bytes per step that parameter offload
            (``offload_parameters``) reloads over the same host-to-device direction;
            the activations' reloads get what is left.

    Returns:
        The plan; ``plan.apply(model)`` carries it out.

    Raises:
        TypeError: If ``memory_budget`` is not a float or an int, ``example_inputs`` is
            not a tuple (or list) or a dict (a bare tensor ``x`` is refused: pass
            ``(x,)``), ``rates`` is not a :class:`DeviceRates`, or ``profile`` is not
            what :func:`checkpointing.profile_step` returns.
        ValueError: If ``memory_budget`` is out of range or below what checkpointing
            every candidate module call reaches (the message gives the smallest
            reachable fraction), the model is in evaluation mode, no module can be
            checkpointed (the message says why), no model output requires grad, or
            ``example_inputs`` pass ``use_cache=True`` or a key-value cache (a
            transformers ``config.use_cache`` that is ``True`` is instead set to
            ``False``, with a warning), or ``profile`` was recorded for another model,
            other inputs, another device type or while other tensors required grad.
    """
    validate_budget(memory_budget)
    validate_planned(model, example_inputs)
    refuse_cache_inputs(example_inputs)
    if rates is not None and not isinstance(rates, DeviceRates):
        raise TypeError(
            f"checkpointing: rates must be a DeviceRates, got {type(rates).__name__}. "
            "Pass checkpointing.calibrate_rates(...) or checkpointing.default_rates(...), "
            "or leave it None."
        )
    if profile is not None and not isinstance(profile, RecordedStep):
        raise TypeError(
            f"checkpointing: profile must be what checkpointing.profile_step returns, got "
            f"{type(profile).__name__}. Pass profile_step(model, example_inputs) or None."
        )
    switch_off_kv_cache(model)
    backend = _backend(backend)
    if profile is not None:
        _check_profile(profile, model, example_inputs, backend)
    offload = OffloadRequest.of(offload_activations, offload_host_bytes, parameter_reload_bytes)
    rates, rates_note = host_rates(backend) if rates is None else (rates, "")
    return agreed(
        lambda: _plan(
            model,
            example_inputs,
            memory_budget,
            backend,
            selective,
            rates,
            rates_note,
            profile,
            offload,
        )
    )


def profile_step(
    model: nn.Module, example_inputs: Any, *, backend: Accelerator | str | None = None
) -> RecordedStep:
    """Record one training step of ``model`` for planning: what it computes, moves and keeps.

    The step runs on fake tensors, as :func:`plan_checkpointing` runs it (no activation
    memory, no random number drawn), and one real forward without grad checks its
    module calls' inputs (none on a lazy device). The record holds each operator call's
    FLOPs and bytes and no rate, so one record serves any number of plans::

        profile = profile_step(model, (x,))
        plan = plan_checkpointing(model, (x,), 0.5, rates=rates, profile=profile)
        other = plan_checkpointing(model, (x,), 0.5, rates=other_rates, profile=profile)

    Args:
        model: The model, on its device and in training mode, not yet checkpointed.
        example_inputs: A tuple of positional arguments (or a dict of keyword
            arguments), shaped like a training batch.
        backend: The backend or its name; ``None`` means :func:`accel.get_backend`.

    Returns:
        The recorded step, for :func:`plan_checkpointing`'s ``profile=``.

    Raises:
        TypeError: As :func:`plan_checkpointing`, for ``model`` or ``example_inputs``.
        ValueError: As :func:`plan_checkpointing`, for the model's mode and KV cache.
    """
    validate_planned(model, example_inputs)
    refuse_cache_inputs(example_inputs)
    switch_off_kv_cache(model)
    return record_step(model, example_inputs, _backend(backend))


def _backend(backend: Accelerator | str | None) -> Accelerator:
    resolved = resolve_backend(backend)
    return accel.get_backend() if resolved is None else resolved


def _check_profile(
    profile: RecordedStep, model: nn.Module, example_inputs: Any, backend: Accelerator
) -> None:
    """Raise ``ValueError`` unless ``profile`` was recorded for this model, inputs and device."""
    pairs = (
        ("another model", "this model has", profile.structure, structure_of(model)),
        ("other inputs", "these inputs have", profile.inputs, inputs_of(example_inputs)),
        ("another device type", "this backend has", (profile.device_type,), (backend.device_type,)),
    )
    for what, here, recorded, given in pairs:
        if recorded != given:
            first = next(
                ((r, g) for r, g in zip(recorded, given, strict=False) if r != g),
                (", ".join(recorded) or "nothing", ", ".join(given) or "nothing"),
            )
            raise ValueError(
                f"checkpointing: the profile passed was recorded for {what}: it has "
                f"{first[0]!r} where {here} {first[1]!r}. Record one with "
                "checkpointing.profile_step(model, example_inputs, backend=...) for this "
                "model, these inputs and this backend, or pass profile=None."
            )
    if profile.grads != grads_of(model, example_inputs):
        raise ValueError(
            "checkpointing: the profile passed was recorded while other parameters or "
            "inputs required grad than now, and what autograd saves depends on it. Record "
            "one with checkpointing.profile_step(model, example_inputs) as the model and "
            "inputs are now, or pass profile=None."
        )


def _plan(
    model: nn.Module,
    example_inputs: Any,
    memory_budget: float | int,
    backend: Accelerator,
    selective: bool,
    rates: DeviceRates,
    rates_note: str = "",
    recorded: RecordedStep | None = None,
    offload: OffloadRequest | None = None,
) -> CheckpointPlan:
    device_start = _device_start(backend)
    notes = [rates_note] if rates_note else []
    reason = unavailable_reason() if selective else None
    if reason is not None:
        selective = False
        notes.append(
            f"operator grain unavailable (whole modules and saved tensors only): {reason}."
        )
    if recorded is None:
        recorded = record_step(model, example_inputs, backend)
    profile = cost(recorded, rates)
    if profile.fallback:
        notes.insert(0, f"Profiled on real tensors: {profile.fallback}.")
    if recorded.aligned:
        notes.append(aligned_note(recorded.aligned))
    if recorded.unlike_real:
        notes.append(unlike_real_note(recorded.unlike_real))
    plain = profile.plain_bytes
    budget = (
        math.floor(memory_budget * plain) if isinstance(memory_budget, float) else memory_budget
    )
    settings, why = (None, "") if offload is None else offload_settings(offload, backend, profile)
    options = candidates(profile, selective, settings)
    pool, best = search(profile, options, budget, memory_budget)
    while (largest := over_cap(best.chosen, settings)) is not None:
        options = {**options, largest: without_offload(options[largest])}
        pool, best = search(profile, options, budget, memory_budget)
    notes += [note for note in (why, offload_note(best.chosen, settings)) if note]
    plan = _build(profile, options, best, pool, budget, " ".join(notes))
    plan = _with_model(plan, model, example_inputs)
    if device_start is None:
        return plan
    backend.synchronize()
    return replace(
        plan,
        device_bytes=backend.memory_allocated() - device_start,
        device_peak_bytes=backend.max_memory_allocated() - device_start,
    )


def _with_model(plan: CheckpointPlan, model: nn.Module, example_inputs: Any) -> CheckpointPlan:
    return replace(plan, structure=structure_of(model), inputs=inputs_of(example_inputs))


def _device_start(backend: Accelerator) -> int | None:
    """Bytes the device holds before planning (its peak counter reset), where it counts."""
    if not backend.supports_memory_stats:
        return None
    backend.synchronize()
    start = backend.memory_allocated()
    backend.reset_peak_memory_stats()
    return start


def _frontier(profile: StepProfile, options: dict[str, list[Option]], name: str) -> list[str]:
    """The candidates below ``name`` reached through non-candidates only."""
    found = []
    for child in profile.modules[name].children:
        if child in options:
            found.append(child)
        else:
            found.extend(_frontier(profile, options, child))
    return found


def _rows(
    profile: StepProfile,
    options: dict[str, list[Option]],
    chosen: dict[str, Option],
    name: str = "",
) -> list[PlanRow]:
    """One row per chosen module call, and per kept one at the level of repeated blocks."""
    if name in chosen:
        option = chosen[name]
        kept = storage_bytes(profile, option.kept) + option.extra_bytes
        return [PlanRow(name, option.kind, option.decision, kept, option.seconds)]
    below = _frontier(profile, options, name)
    inside = any(not name or other.startswith((f"{name}.", f"{name}@")) for other in chosen)
    repeated = len(below) > 1 and len({profile.modules[b].kind for b in below}) == 1
    if name in options and not inside and not repeated:
        owned = [
            index
            for index, stacks in profile.saved_by.items()
            if all(name in stack for stack in stacks)
        ]
        return [PlanRow(name, "module", KEEP, storage_bytes(profile, owned), 0.0)]
    return [row for child in below for row in _rows(profile, options, chosen, child)]


def _build(
    profile: StepProfile,
    options: dict[str, list[Option]],
    taken: Candidate,
    pool: list[Candidate],
    budget: int,
    note: str,
) -> CheckpointPlan:
    chosen = taken.chosen
    recompute = sum(option.seconds for option in chosen.values())
    considered = tuple(
        ConsideredPlan(
            c.label,
            c.estimated_bytes,
            c.estimated_seconds,
            c.fits(budget),
            c is taken,
            c.reason,
            c.weighed_seconds,
        )
        for c in pool
    )
    if taken.notes:
        note = f"{note} {'; '.join(taken.notes)}.".strip()
    forms, held = compiled_forms(profile, options, chosen)
    note = f"{note} {compiled_note(profile, taken, forms, held)}".strip()
    calls = {
        record.module: record.calls
        for name, record in profile.modules.items()
        if record.calls > 1 and name in chosen
    }
    enclosed = enclosed_calls(profile.modules, chosen, calls)
    return CheckpointPlan(
        considered=considered,
        choices={name: _decision(profile, name, option, forms) for name, option in chosen.items()},
        rows=tuple(_rows(profile, options, chosen)),
        plain_bytes=profile.plain_bytes,
        estimated_bytes=taken.estimated_bytes,
        estimated_step_time_ratio=(profile.step_time + recompute) / profile.step_time,
        budget_bytes=budget,
        step_seconds=profile.step_time,
        rates=profile.rates,
        calls=calls,
        enclosed=enclosed,
        note=note,
        margins=margins(),
        compiled_estimated_bytes=held,
    )


def _decision(
    profile: StepProfile, name: str, option: Option, forms: dict[str, Option]
) -> Decision:
    """The plan's decision for ``name``: its grain's payload, with its compiled form."""
    grain = grain_named(option.decision)
    assert grain is not None, option.decision  # options come from registered grains
    payload = grain.payload(profile, name, option)
    if name in forms:
        payload = grain.compiled_as(payload, forms[name].decision)
    return Decision(option.decision, payload)
