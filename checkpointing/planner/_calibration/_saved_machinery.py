"""What the saved-tensor grain's machinery costs on the device, timed on the grain itself.

The grain (:class:`checkpointing._saved_wrapper.SavedTensorWrapper`) pays Python for
every tensor autograd saves in a planned module (its pack and unpack hooks check the
tensor against the plan), for every operator call a recipe runs again in backward
(the call's arguments are rebuilt from the plan's templates, its outputs looked up),
and for every dropout mask it packs (a check of the mask's values, the booleans, and
the float tensor rebuilt in backward). A pair of bare hooks costs a fraction of that,
so the cost model priced the grain far below what it measures (issue 40's breakdown:
3 to 8 times on the zoo's transformers on the host). Each planned module call also pays
a cost of its own, whatever it saves: the wrapper checks the call's inputs, sets up its
hooks and keeps the generator states, and backward's first recomputation in the call
sets up its lookups (issue 40: 0.3 to 0.6 ms a call on the zoo's T5 on the host, where
one call's tensors were priced at 0.05 ms). :func:`saved_machinery` times those four
costs on small chains of layers that are not any model the planner is judged on,
through the grain's own code: the planner's profile and saved units make the plans, and
the wrapper runs them.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import NamedTuple

import torch
from torch import nn

from accel import Accelerator

from ..._packed import Packed
from ..._saved_plan import DROP, SavedPlan
from ..._saved_wrapper import SavedTensorWrapper
from .._cost import DeviceRates, tensor_bytes
from .._pricing import cost
from .._profile import profile_step
from .._saved_grain import saved_plan, saved_units
from ._stopwatch import Sizes, best_times, seconds

__all__ = ["SavedMachinery", "saved_machinery"]

_LAYERS = 4  # layers of the chain
_CALLS = 8  # module calls the per-call cost is timed over, each planned on its own
_SHAPE = (4, 64, 64)  # the chain's activations: small, so that the machinery shows
_ROUNDS = 5  # times the stopwatch's rounds: the differences timed are a few hundred µs


class SavedMachinery(NamedTuple):
    """The saved-tensor grain's costs (:class:`DeviceRates` fields of the same names)."""

    hook_seconds: float
    replay_seconds: float
    pack_bytes: float
    saved_call_seconds: float


class _Chain(nn.Module):
    """Layers whose saved tensors are one cheap call from kept ones: the grain's case."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(_LAYERS))
        self.linears = nn.ModuleList(nn.Linear(width, width) for _ in range(_LAYERS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for norm, linear in zip(self.norms, self.linears, strict=True):
            hidden = nn.functional.gelu(linear(norm(x)))
            x = x + hidden * torch.sigmoid(hidden)
        return x


class _Block(nn.Module):
    """One layer of :class:`_Chain`, as a block the grain plans on its own."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden: torch.Tensor = self.linear(self.norm(x))
        return x + hidden * torch.sigmoid(hidden)


def saved_machinery(backend: Accelerator, sizes: Sizes, rates: DeviceRates) -> SavedMachinery:
    """Time the saved-tensor grain's machinery on ``backend``'s device.

    * ``hook_seconds``: per saved tensor, the wrapper's hooks with nothing planned,
      over the plain chain;
    * ``replay_seconds``: per operator call a recipe runs again, what dropping every
      droppable tensor adds beyond those hooks and beyond the calls' own cost at
      ``rates``;
    * ``pack_bytes``: a dropout mask's float bytes per second, packed and rebuilt;
    * ``saved_call_seconds``: per planned module call, what a chain of blocks, each
      planned on its own to drop one tensor, adds beyond its hooks and replays at the
      two costs above and its replayed calls' own cost at ``rates``.

    Args:
        backend: The backend the model runs on; its generators are left as they were.
        sizes: How many rounds to time, and the mask's elements.
        rates: The rates measured so far, which price the replayed calls' own work.

    Returns:
        The four costs, each at least 0 (``pack_bytes`` positive).
    """
    device = backend.device()
    with backend.fork_rng():
        model = nn.Sequential(_Chain(_SHAPE[-1])).to(device)  # the chain is module "0"
        x = torch.randn(*_SHAPE, device=device, requires_grad=True)
        profile = cost(profile_step(model, (x,), backend), rates)
        record = profile.modules["0"]
        units = [u for u in (saved_units(profile, "0") or [[]])[-1] if u.action == DROP]
        dropping = saved_plan(profile, "0", units)
        hooks_only = SavedPlan(module="0", positions={}, geometries={}, recipes={}, inputs={})
        variants = [model]
        for plan in (hooks_only, dropping):
            variant = copy.deepcopy(model)
            variant[0] = SavedTensorWrapper(variant[0], plan, backend=backend)
            variants.append(variant)

        def run(module: nn.Module) -> None:
            module(x).sum().backward()
            x.grad = None
            module.zero_grad(set_to_none=True)

        for module in variants:  # warm-up: the wrapper checks its first call
            run(module)
        plain, hooked, dropped = best_times(
            [lambda m=m: run(m) for m in variants],  # type: ignore[misc]
            backend,
            replace(sizes, rounds=_ROUNDS * sizes.rounds),  # small differences: more rounds
        )
        mask = nn.functional.dropout(torch.ones(sizes.elements, device=device), 0.1)
        packed = seconds(lambda: Packed.of(mask).unpack(), backend, sizes)  # type: ignore[union-attr]
    steps = [step for unit in units for step in unit.steps]
    own = sum(step.seconds for step in steps)
    hook = max(hooked - plain, 0.0) / max(len(record.packs), 1)
    replay = max(dropped - hooked - own, 0.0) / max(len(steps), 1)
    call = _call_seconds(backend, sizes, rates, hook, replay)
    return SavedMachinery(hook, replay, tensor_bytes(mask) / packed, call)


def _call_seconds(
    backend: Accelerator, sizes: Sizes, rates: DeviceRates, hook: float, replay: float
) -> float:
    """Seconds one planned call costs beyond ``hook`` per saved tensor, ``replay`` per step.

    The single chain above plans one call, so the cost every call pays whatever its
    size is spread there over many tensors and steps; a model's plan has many calls that
    each save a few. Here :data:`_CALLS` blocks are planned one by one, each dropping
    its first droppable tensor, and timed against the same blocks unplanned.
    """
    device = backend.device()
    with backend.fork_rng():
        blocks = nn.Sequential(*(_Block(_SHAPE[-1]) for _ in range(_CALLS))).to(device)
        x = torch.randn(*_SHAPE, device=device, requires_grad=True)
        profile = cost(profile_step(blocks, (x,), backend), rates)
        planned = copy.deepcopy(blocks)
        priced = 0.0
        for index in range(_CALLS):
            name = str(index)
            droppable = [u for u in (saved_units(profile, name) or [[]])[-1] if u.action == DROP]
            units = droppable[:1]
            steps = [step for unit in units for step in unit.steps]
            priced += (
                hook * len(profile.modules[name].packs)
                + replay * len(steps)
                + sum(step.seconds for step in steps)
            )
            plan = saved_plan(profile, name, units)
            planned[index] = SavedTensorWrapper(planned[index], plan, backend=backend)

        def run(module: nn.Module) -> None:
            module(x).sum().backward()
            x.grad = None
            module.zero_grad(set_to_none=True)

        for module in (blocks, planned):  # warm-up: the wrappers check their first call
            run(module)
        plain, timed = best_times(
            [lambda: run(blocks), lambda: run(planned)],
            backend,
            replace(sizes, rounds=_ROUNDS * sizes.rounds),
        )
    return max(timed - plain - priced, 0.0) / _CALLS
