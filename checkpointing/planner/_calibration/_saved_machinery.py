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
from ..._saved_plan import DROP, PACK, SavedPlan
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


def _wrapped(model: nn.Sequential, plans: list[SavedPlan], backend: Accelerator) -> list[nn.Module]:
    """Copies of ``model`` with its module ``"0"`` carried out under each plan."""
    variants: list[nn.Module] = []
    for plan in plans:
        variant = copy.deepcopy(model)
        variant[0] = SavedTensorWrapper(variant[0], plan, backend=backend)
        variants.append(variant)
    return variants


def _step_times(
    variants: list[nn.Module], x: torch.Tensor, backend: Accelerator, sizes: Sizes
) -> list[float]:
    """Each variant's best time of a training step on ``x``, after a warm-up step.

    The warm-up runs each wrapper's checked first call; the differences timed are a
    few hundred microseconds, so the stopwatch takes :data:`_ROUNDS` times its rounds.
    """

    def run(module: nn.Module) -> None:
        module(x).sum().backward()
        x.grad = None
        module.zero_grad(set_to_none=True)

    for module in variants:
        run(module)
    return best_times(
        [lambda m=m: run(m) for m in variants],  # type: ignore[misc]
        backend,
        replace(sizes, rounds=_ROUNDS * sizes.rounds),
    )


#: A plan that drops and packs nothing: the wrapper's hooks alone.
_HOOKS_ONLY = SavedPlan(module="0", positions={}, geometries={}, recipes={}, inputs={})


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
        variants = [model, *_wrapped(model, [_HOOKS_ONLY, dropping], backend)]
        plain, hooked, dropped = _step_times(variants, x, backend, sizes)
    steps = [step for unit in units for step in unit.steps]
    own = sum(step.seconds for step in steps)
    hook = max(hooked - plain, 0.0) / max(len(record.packs), 1)
    replay = max(dropped - hooked - own, 0.0) / max(len(steps), 1)
    call = _call_seconds(backend, sizes, rates, hook, replay)
    return SavedMachinery(hook, replay, _pack_bytes(backend, sizes, rates, hook), call)


class _Dropouts(nn.Module):
    """Layer norms each followed by dropout: one mask of the given shape per layer."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(_LAYERS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for norm in self.norms:
            x = x + nn.functional.dropout(norm(x), 0.1)
        return x


def _pack_bytes(backend: Accelerator, sizes: Sizes, rates: DeviceRates, hook: float) -> float:
    """Mask bytes per second the grain packs and rebuilds, through its own wrapper.

    A chain of dropout layers whose masks hold a quarter of ``sizes.elements`` each (2
    MiB of float32 at the calibration's size, as a transformer's dropout masks are) is
    planned to pack every mask and timed against the same hooks planning nothing, as a
    call after its layout's checked first one runs: a mask packed in a step is cold in
    the cache and its rebuilt float tensor a fresh allocation, which a loop packing one
    mask again and again does not see (it measured 3.16 GB/s on the Xeon, where the
    grain packs 2.0 to 2.6). A device whose dropout draws its mask in kernels of its
    own (no mask to pack: :attr:`StepProfile.host_masks`) times :class:`Packed` alone.
    """
    device = backend.device()
    width = 256
    rows = max(sizes.elements // 4 // width, 1)
    with backend.fork_rng():
        model = nn.Sequential(_Dropouts(width)).to(device)
        x = torch.randn(rows, width, device=device, requires_grad=True)
        profile = cost(profile_step(model, (x,), backend), rates)
        units = [u for u in (saved_units(profile, "0") or [[]])[-1] if u.action == PACK]
        if not units:
            mask = nn.functional.dropout(torch.ones(sizes.elements, device=device), 0.1)
            packed = seconds(lambda: Packed.of(mask, check=False).unpack(), backend, sizes)  # type: ignore[union-attr]
            return tensor_bytes(mask) / packed
        packing_plan = saved_plan(profile, "0", units)
        variants = _wrapped(model, [_HOOKS_ONLY, packing_plan], backend)
        hooked, packing = _step_times(variants, x, backend, sizes)
    masks = sum(profile.storage_bytes[index] for unit in units for index in unit.storages)
    hooks = 2 * len(units) * hook  # priced apart: a pack unit's two hooks
    return masks / max(packing - hooked - hooks, 1e-9)


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

        plain, timed = _step_times([blocks, planned], x, backend, sizes)
    return max(timed - plain - priced, 0.0) / _CALLS
