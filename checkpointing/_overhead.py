"""What a selective checkpoint costs per operator call, beyond recomputing operators.

A selective policy runs in Python for every operator call of the region twice (in the
forward, which also caches the kept outputs, and in the recomputation), and the
measured grain's guard once more in the forward. On a host CPU that is tens of
microseconds a call: for a transformer block of about eighty calls it is as much as
recomputing its pointwise operators. The planner adds it to each selective option's
recompute time, so that it prefers a whole-module checkpoint where the policy's
overhead outweighs what it saves.

:func:`selective_overhead` measures it on the backend with a small transformer-like
chain of tiny tensors (linear, layer norm, GELU, dropout, reshapes: operators with
the argument lists of real ones, since Python's cost per call grows with them), whose
own compute is negligible: per call, ``(none - full) / N`` (a policy that recomputes
everything against the plain checkpoint) and, per kept call, ``(all - plain) / N`` less
that (a policy that keeps everything against no checkpoint). An asynchronous device
can hide some of this behind its queue, so there it is an upper bound.

That chain misses costs that only a real model shows (Python per call grows with the
operator's arguments; kept outputs hold memory the allocator would have reused), so
the planner also times its first plan in place (:func:`measured_steps`, interleaved
with a reference plan, :mod:`._timed`) and, where the step is slower than estimated in
every round, spreads the median shortfall over the selective regions' operator calls
and plans once more.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from accel import Accelerator

from . import _clock
from ._checkpoint import run_checkpoint
from ._measure import LiveActivationMeter
from ._non_reentrant import ContextFn
from ._packed import Packed
from ._replay import Geometry
from ._root import uncheckpoint_root
from ._selective import kept_calls_context_fn
from ._steps import backward, call_model, timed_step, untouched

__all__ = [
    "live_bytes",
    "measured_steps",
    "pack_seconds",
    "selective_overhead",
]

_LAYERS = 6
_ROUNDS = 5


class _Chain(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(_LAYERS):
            hidden = torch.nn.functional.gelu(self.linear(self.norm(x)))
            hidden = torch.nn.functional.dropout(hidden, 0.1, training=True)
            x = x + hidden.reshape(2, 2, 8).transpose(0, 1).reshape(4, 8)
        return x


class _Counter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.calls.append(str(func))
        return func(*args, **(kwargs or {}))


def _best_times(steps: list[Callable[[], Any]], backend: Accelerator) -> list[float]:
    """The fastest of ``_ROUNDS`` runs of each step, the steps interleaved round by round.

    Interleaving puts a busy spell of the host on every step alike, rather than on
    whichever ran during it.
    """
    best = [float("inf")] * len(steps)
    for round_index in range(_ROUNDS):
        shift = round_index % len(steps)
        for number in [*range(shift, len(steps)), *range(shift)]:
            backend.synchronize()
            start = _clock.now()
            steps[number]()
            backend.mark_step()
            backend.synchronize()
            best[number] = min(best[number], _clock.now() - start)
    return best


def selective_overhead(backend: Accelerator) -> tuple[float, float]:
    """Seconds per operator call, and extra seconds per kept call, of a selective policy.

    Args:
        backend: The backend the model runs on; its generators are left as they were.

    Returns:
        ``(per_call, per_kept_call)``, both at least 0.
    """
    with backend.fork_rng():
        chain = _Chain().to(backend.device())
        x = torch.ones(4, 8, device=backend.device(), requires_grad=True)
        counter = _Counter()
        with counter:
            chain(x)
        seen: dict[str, int] = {}
        every = []
        for name in counter.calls:
            every.append((name, seen.get(name, 0)))
            seen[name] = seen.get(name, 0) + 1
        calls = len(every)

        def run(context_fn: ContextFn | None, checkpointed: bool = True) -> None:
            if checkpointed:
                out = run_checkpoint(
                    chain, (x,), {}, use_reentrant=False, backend=backend, context_fn=context_fn
                )
            else:
                out = chain(x)
            out.sum().backward()

        keep_none, keep_all = kept_calls_context_fn(()), kept_calls_context_fn(every)
        run(keep_all)  # warm-up: first calls build caches
        plain, full, none, kept = _best_times(
            [
                lambda: run(None, checkpointed=False),
                lambda: run(None),
                lambda: run(keep_none),
                lambda: run(keep_all),
            ],
            backend,
        )
    per_call = max(none - full, 0.0) / calls
    per_kept = max((kept - plain) / calls - per_call, 0.0)
    return per_call, per_kept


def pack_seconds(geometry: Geometry, device: torch.device, backend: Accelerator) -> float:
    """Seconds to pack and rebuild a dropout mask of ``geometry`` on ``device``.

    The best of a few rounds (:mod:`._packed`), for the saved-tensor grain's pack units.
    """
    mask = torch.zeros(geometry.size, dtype=geometry.dtype, device=device)
    mask.view(-1)[::2] = 2.0

    def round_trip() -> None:
        packed = Packed.of(mask)
        if packed is not None:
            packed.unpack()

    return _best_times([round_trip], backend)[0]


@contextmanager
def _applied(model: nn.Module, apply: Callable[[nn.Module], list[str]] | None) -> Iterator[None]:
    """``model`` with a plan applied in place (``None``: plain), the wrappers removed after."""
    wrapped = [] if apply is None else apply(model)
    try:
        yield
    finally:
        for name in wrapped:
            if not name:
                uncheckpoint_root(model)
                continue
            parent_name, _, leaf = name.rpartition(".")
            parent = model.get_submodule(parent_name)
            setattr(parent, leaf, getattr(parent, leaf).module)


def measured_steps(
    model: nn.Module,
    example_inputs: Any,
    backend: Accelerator,
    applies: list[Callable[[nn.Module], list[str]]],
    rounds: int = 5,
) -> list[list[float]]:
    """Each plan's step times over ``rounds`` interleaved rounds (after a warm-up round).

    Each round applies every plan in place in turn (rotating the order), times one step
    and removes the wrappers again, so that round ``i`` of every plan ran at about the
    same time on the host: comparing plans round by round cancels what the host's load
    did to both. Parameters, gradients, buffers and generator states are as they were
    afterwards. No plain step runs: the planner never holds the plain activations.
    """
    times: list[list[float]] = [[] for _ in applies]
    with untouched(model, backend):
        for round_index in range(rounds + 1):
            shift = round_index % len(applies)
            for number in [*range(shift, len(applies)), *range(shift)]:
                with _applied(model, applies[number]):
                    seconds = timed_step(model, example_inputs, backend)
                    model.zero_grad(set_to_none=True)
                if round_index > 0:
                    times[number].append(seconds)
    return times


def live_bytes(
    model: nn.Module,
    example_inputs: Any,
    backend: Accelerator,
    apply: Callable[[nn.Module], list[str]],
) -> int:
    """Bytes a forward of ``model`` (a plan applied in place) leaves alive for backward.

    :class:`._measure.LiveActivationMeter`: autograd's saved storages, the inputs a
    checkpoint keeps and the outputs a selective policy caches, and the output itself
    (the same in every plan; the profile's ``plain_live_bytes`` is the plain model's
    figure, so the difference is the plan's activation bytes).
    """
    exclude = [*model.parameters(), *model.buffers()]
    with untouched(model, backend), _applied(model, apply):
        with LiveActivationMeter(exclude=exclude) as meter:
            output = call_model(model, example_inputs)
        held = meter.bytes
        backward(output)
        del output
        model.zero_grad(set_to_none=True)
    return held
