"""The cost pass: a recorded step priced at a device's rates, as its own stage.

The profile (:mod:`._profile`) records what each operator call computes and moves
(:class:`._work.OpWork`) and no rate; :func:`cost` prices it. Planning again at other
rates therefore prices again and never profiles again. An operator call takes

``seconds = max(flops / flop rate, bytes / byte rate) + call seconds``

with the flop rate of its class (matmul, attention, convolution; an FFT at the matmul
rate, the rates having no class of their own for it), its bytes (arguments read and new
storages written) at its operator's own byte rate where the rates have one, else the
default one, and a random draw's new bytes at the random-draw rate. A fused attention
call adds its scores' softmax to its flops' time (``scores x attention_score_seconds``);
its dropout argument marks it as drawing, but its price is its flops', as for any call
with a flop class. A view, an alias, a
metadata query or an allocation left unwritten (``empty_like``) moves nothing and costs
the call seconds alone; a ``prim`` query, which only the fake step dispatches, costs
nothing.

Where the step ran on real tensors (``fallback``), no backward was recorded, and each
forward call's backward is estimated from the call itself (:func:`backward_seconds`): a
product's (matmul, attention, convolution, FFT) as two of it, for the gradients of its
two operands; a random draw's as nothing, since a draw has no gradient (dropout's mask
is applied by a product of its own); any other call's as the call again, moving about
the bytes it moved. On 19 model families on a host CPU (``benchmarks/bench_backward.py``)
the backward's ratio to the forward this gives was a median 0.07 from the measured one,
where twice the forward (the rule before 2026-11-29) was 0.89 from it.

The pass is pure and deterministic: the same recorded step and rates give the same
priced profile, bit for bit, summed in the order the step ran.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import replace

from ._cost import DeviceRates
from ._records import ModuleProfile, OpCall, RecordedStep, StepProfile
from ._work import ATTENTION, CONVOLUTION, FFT, MATMUL, OpWork

__all__ = ["backward_seconds", "by_bytes", "cost", "dispatched", "op_seconds"]

#: Operators the fake step dispatches and the device's never does: a fake tensor answers
#: ``tensor.device`` through ``prim.device``, a real one in C++ without a dispatch.
_FAKE_ONLY = "prim."


def dispatched(ops: Iterable[OpCall]) -> int:
    """How many of the recorded calls ``ops`` the device dispatches.

    The fake step records ``prim`` queries (:data:`_FAKE_ONLY`) that a real step answers
    without a dispatch: in a transformer block they outnumber the real calls. A selective
    policy runs once per dispatched call, so it is priced per these only.
    """
    return sum(1 for op in ops if not op.name.startswith(_FAKE_ONLY))


def by_bytes(work: OpWork) -> bool:
    """Whether ``work``'s price rests on a byte rate of the table's (:func:`op_seconds`).

    Not a matrix product's, attention's or a convolution's (their flops), nor a random
    draw's (the random-draw rate), nor a call that moves nothing (the call seconds).
    """
    return work.kind not in (MATMUL, ATTENTION, CONVOLUTION) and not work.random and work.moves


def backward_seconds(work: OpWork, forward: float) -> float:
    """The estimated backward of one forward call that took ``forward`` seconds.

    For a step whose backward was not recorded (module docstring): two products for a
    product, nothing for a random draw, the call again for anything else.
    """
    if work.kind in (MATMUL, ATTENTION, CONVOLUTION, FFT):
        return 2.0 * forward
    if work.random:
        return 0.0
    return forward


def op_seconds(work: OpWork, rates: DeviceRates) -> float:
    """Seconds one operator call takes on the device ``rates`` describe (module docstring)."""
    if work.operator.startswith(_FAKE_ONLY):
        return 0.0
    if not work.moves:
        return rates.call_seconds  # a view, an alias, a query, an empty: nothing moves
    if work.kind in (MATMUL, FFT):
        compute = work.flops / rates.matmul_flops
    elif work.kind == ATTENTION:
        compute = work.flops / rates.attention_flops + work.scores * rates.attention_score_seconds
    elif work.kind == CONVOLUTION:
        compute = work.flops / rates.convolution_flops
    else:
        compute = 0.0
    if work.random and not work.kind and rates.random_bytes > 0:
        drawn = max(work.fresh_bytes, work.read_bytes if work.mutates else 0)
        transfer = drawn / rates.random_bytes
    else:
        moved = work.read_bytes + work.fresh_bytes
        transfer = moved / rates.operator_bytes.get(work.operator, rates.memory_bytes)
    return max(compute, transfer) + rates.call_seconds


def cost(profile: RecordedStep, rates: DeviceRates) -> StepProfile:
    """Price a recorded step at ``rates``: the planner's cost pass.

    Every operator call's seconds (:func:`op_seconds`), each module call's forward and
    recomputed seconds, and the plain step's, summed in the order the step ran. The
    recorded step is left as it was; each feature is priced once however many calls
    share it.

    Args:
        profile: The step :func:`checkpointing.profile_step` recorded.
        rates: The device's rates.

    Returns:
        The priced profile the planner's options and search read.
    """
    prices: dict[OpWork, float] = {}

    def seconds(work: OpWork | None) -> float:
        if work is None:
            return 0.0
        price = prices.get(work)
        if price is None:
            price = prices[work] = op_seconds(work, rates)
        return price

    forward = _total(seconds(work) for work in profile.forward)
    if profile.fallback:
        backward = _total(backward_seconds(work, seconds(work)) for work in profile.forward)
    else:
        backward = _total(seconds(work) for work in profile.backward)
    return StepProfile(
        modules={name: _priced(record, seconds) for name, record in profile.modules.items()},
        storage_bytes=profile.storage_bytes,
        saved_by=profile.saved_by,
        step_time=forward + backward,
        forward_time=forward,
        rates=rates,
        fallback=profile.fallback,
        host_masks=profile.host_masks,
    )


def _total(values: Iterable[float]) -> float:
    """A left-to-right sum from 0.0, as the step ran (``sum`` may compensate on 3.12+)."""
    total = 0.0
    for value in values:
        total += value
    return total


def _priced(record: ModuleProfile, seconds: Callable[[OpWork | None], float]) -> ModuleProfile:
    """A copy of ``record`` with its calls' and its own seconds (the record is unchanged)."""
    ops: list[OpCall] = []
    forward = recomputed = 0.0
    for call in record.ops:
        price = seconds(call.work)
        priced = copy.copy(call)
        priced.seconds = price
        ops.append(priced)
        forward += price
        if not call.kept:
            recomputed += price
    return replace(record, ops=ops, forward_time=forward, recomputed_time=recomputed)
