"""Under ``torch.compile``: what each saved-tensor-grain module call runs as instead.

The saved-tensor grain works through saved-tensor hooks, which dynamo cannot trace.
Left to itself, the compiled graph would keep whatever the compiler's partitioner
chooses inside such a module, up to everything it saves (a Qwen2-like decoder planned
at 0.5 kept 0.76x of the eager step compiled). So every ``"recompute saved"`` call gets
a *compiled form*, a region the compiler honours: the whole module (torch's checkpoint
region, keeping its inputs) or a selective region by operator class (keeping matmul,
convolution and attention outputs). The fastest form is taken whose substitution keeps
the plan's estimated bytes within the plan's estimate, so a plan holds its estimate
compiled as well as eager; where none does, the form that keeps the least.

A compiled region that recomputes a random draw keeps the generator's state for it,
to draw the same numbers again: the host generator's whole state (5,056 bytes) where
draws land in host memory, a seed and an offset elsewhere. That is nothing beside a
training step's activations, but it can be more than a tiny model's; the plan's note
gives the compiled estimate with it, and says when it is above the plan's estimate.

A module whose forward rebinds one of its own attributes (RecurrentGemma keeps its
recurrent state so) breaks the graph inside a checkpointed region: dynamo will not
trace a side effect there unless told it need not be replayed in backward. The note
names those calls (:func:`assigning_calls`) and the setting.

The chosen-calls grain (``"keep costly ops"``) is not a compiled form: it names
operator calls by their occurrence in the eager dispatch, and a traced graph's
functional operators can be named and counted otherwise.
"""

from __future__ import annotations

import torch

from .._decisions import ALTERNATE, CHOSEN, FULL, KEEP, SELECTIVE
from ._grains import compiled_forms as grains_compiled
from ._grains import grain_named
from ._options import Option
from ._records import StepProfile
from ._search import Candidate, estimate

__all__ = [
    "COMPILED_FORMS",
    "assigning_calls",
    "compiled_bytes",
    "compiled_forms",
    "compiled_note",
    "compiled_seconds",
]

#: The decisions that run as a checkpointed region (a higher-order operator) compiled.
_REGIONS = frozenset({FULL, SELECTIVE, ALTERNATE, CHOSEN})

COMPILED_FORMS = grains_compiled()
"""The regions a saved-tensor-grain call may run as under ``torch.compile``: the grains
that say they may (their ``compiled_form``)."""

_FORM_NAMES = {
    FULL: "whole ('checkpoint')",
    SELECTIVE: "selective ('recompute cheap ops')",
    KEEP: "as they are",
}

#: The state a compiled region keeps per recomputed random draw: the host generator's
#: (mt19937), or a device generator's seed and offset.
HOST_GENERATOR_BYTES = torch.default_generator.get_state().numel()
DEVICE_GENERATOR_BYTES = 16


def compiled_bytes(profile: StepProfile, chosen: dict[str, Option]) -> int:
    """Activation bytes a compiled step keeps with every choice in ``chosen`` a region.

    The plan's estimate, plus the generator state kept for each random draw inside a
    region (recomputed in backward; a kept draw would keep none, so this is an upper bound).
    """
    per_draw = HOST_GENERATOR_BYTES if profile.host_masks else DEVICE_GENERATOR_BYTES
    draws = sum(op.random for name in chosen for op in profile.modules[name].ops)
    return estimate(profile, chosen) + per_draw * draws


def _placed(chosen: dict[str, Option], name: str, form: Option) -> dict[str, Option]:
    """``chosen`` with ``form`` for ``name`` (a ``"keep"`` form: ``name`` not chosen)."""
    placed = {**chosen, name: form}
    if form.decision == KEEP:
        del placed[name]
    return placed


def compiled_forms(
    profile: StepProfile, options: dict[str, list[Option]], chosen: dict[str, Option]
) -> tuple[dict[str, Option], int]:
    """The compiled form of each ``"recompute saved"`` call in ``chosen``, and the bytes.

    Every call starts at the form that keeps the least (fewest bytes, then fewest
    seconds). Then, the calls whose fastest form saves the most seconds first, each
    takes the fastest form that keeps the estimate within ``chosen``'s with the forms
    taken so far. The forms are :data:`COMPILED_FORMS` and ``"keep"`` (the module runs
    as it is, as in the plain compiled step: its eager saved tensors estimate it).

    Returns:
        The form taken for each saved-tensor call, and :func:`compiled_bytes` with
        every form in place (the bytes a compiled step is expected to keep).
    """
    cap = estimate(profile, chosen)
    keep = Option(KEEP, 0, 0.0, frozenset())
    current = dict(chosen)
    weighed: dict[str, list[Option]] = {}
    for name, option in chosen.items():
        grain = grain_named(option.decision)
        if grain is None or grain.traceable:
            continue
        offered = [keep, *(o for o in options[name] if o.decision in COMPILED_FORMS)]
        held = {id(form): estimate(profile, _placed(current, name, form)) for form in offered}
        least = min(offered, key=lambda form: (held[id(form)], compiled_seconds(profile, form)))
        weighed[name] = sorted(offered, key=lambda form: compiled_seconds(profile, form))
        current = _placed(current, name, least)
        weighed[name] = weighed[name][: weighed[name].index(least)]  # the faster ones

    def gain(name: str) -> float:
        seconds = compiled_seconds(profile, current.get(name, keep))
        return seconds - min((compiled_seconds(profile, f) for f in weighed[name]), default=seconds)

    for name in sorted(weighed, key=gain, reverse=True):
        for form in weighed[name]:
            trial = _placed(current, name, form)
            if estimate(profile, trial) <= cap:
                current = trial
                break
    forms = {name: current.get(name, keep) for name in weighed}
    return forms, compiled_bytes(profile, current)


def compiled_seconds(profile: StepProfile, option: Option) -> float:
    """``option``'s recompute seconds in a compiled step: without the policy's own cost.

    A selective policy runs while the graph is traced, not in each step.
    """
    rates = profile.rates
    policy = rates.policy_call_seconds * option.policy_calls
    return option.seconds - policy - rates.policy_kept_seconds * option.kept_count


def assigning_calls(
    profile: StepProfile, chosen: dict[str, Option], forms: dict[str, Option]
) -> dict[str, tuple[str, ...]]:
    """The calls in compiled checkpointed regions that rebind their module's attributes.

    By call, with the attributes (a recurrent state kept for generation). Dynamo refuses
    such a side effect inside the region (torch's checkpoint replays it when backward
    recomputes), breaks the graph there and runs the region eagerly.
    """
    found: dict[str, tuple[str, ...]] = {}
    for name, option in chosen.items():
        decision = forms[name].decision if name in forms else option.decision
        if decision not in _REGIONS:
            continue
        pending = [name]
        while pending:
            record = profile.modules[pending.pop()]
            if record.assigns:
                found[record.name] = record.assigns
            pending.extend(record.children)
    return found


def compiled_note(
    profile: StepProfile, taken: Candidate, forms: dict[str, Option], held: int
) -> str:
    """The plan's sentences on what a compiled step runs and keeps, or ``""``.

    Empty where no call runs otherwise compiled and the compiled estimate is within
    the plan's.

    Args:
        profile: The profiled step.
        taken: The plan the planner took.
        forms: :func:`compiled_forms`' forms for it.
        held: :func:`compiled_forms`' bytes for it.
    """
    plain, estimated = profile.plain_bytes, taken.estimated_bytes
    assigning = assigning_calls(profile, taken.chosen, forms)
    if not forms and held <= estimated and not assigning:
        return ""
    sentences = ["Under torch.compile:"]
    if forms:
        counts = {d: sum(o.decision == d for o in forms.values()) for d in _FORM_NAMES}
        listed = ", ".join(f"{n} {_FORM_NAMES[d]}" for d, n in counts.items() if n)
        eager = sum(taken.chosen[name].seconds for name in forms) * 1e3
        compiled = sum(compiled_seconds(profile, form) for form in forms.values()) * 1e3
        sentences.append(
            f"saved-tensor hooks cannot be traced, so its {len(forms)} 'recompute saved' "
            f"call(s) run otherwise ({listed}), recomputing {compiled:.2f} ms where the "
            f"saved-tensor grain recomputes {eager:.2f} ms;"
        )
    over = held - estimated
    verdict = (
        "within the plan's estimate"
        if over <= 0
        else f"{over / 2**20:.2f} MiB ({over / plain:.2%} of the plain step's) above the "
        "plan's estimate: the forms keep more than the saved-tensor grain (a packed dropout "
        "mask), or the generator states kept for the random draws that compiled regions "
        "recompute add up"
    )
    sentences.append(
        f"a compiled step is estimated to keep {held / plain:.2f}x of the plain step's "
        f"activations, {verdict}."
    )
    if assigning:
        listed = "; ".join(f"{name}: {', '.join(names)}" for name, names in assigning.items())
        sentences.append(
            f"{len(assigning)} module call(s) inside its checkpointed regions rebind "
            f"attributes of their module in forward ({listed}), which dynamo refuses "
            "inside a region: it breaks the graph there and runs the region eagerly, "
            "keeping more than this estimate. Where that state is not needed in backward, "
            "set torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = "
            "True (torch 2.13 has it, 2.9 does not) before compiling."
        )
    return " ".join(sentences)
