"""Operator timings over several forwards: each call's median, and the host's noise.

One forward's timing of an operator call is one sample of a noisy host. The profile
(:mod:`._profile`) records the calls once, with their timings; :func:`repeated` runs
the forward :data:`REPEATS` - 1 more times under a dispatch mode that only times each
call, and gives every call the median of its samples. The spread of the samples over
all calls gives the *noise*: the relative standard deviation of one such median,
which the plan reports (``plan.considered``) and :func:`._timed.steady` uses to set
aside options the timing cannot tell from checkpointing their module whole.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from accel import Accelerator

from . import _clock
from ._steps import call_model, dropping_saved

__all__ = ["REPEATS", "noise_of", "repeated", "timed_call"]

REPEATS = 3  # forwards whose timings each call's median is taken over
# The median of a sample variance over its expectation, for REPEATS - 1 = 2 degrees of
# freedom (chi-squared with 2 degrees of freedom has median 2 ln 2).
_MEDIAN_VARIANCE = math.log(2)
# A median of n samples varies sqrt(pi / 2) times as much as their mean.
_MEDIAN_EFFICIENCY = math.sqrt(math.pi / 2)


def timed_call(
    func: Any, args: Any, kwargs: dict[str, Any], backend: Accelerator, synchronize: bool
) -> tuple[Any, float]:
    """``func(*args, **kwargs)`` and its seconds (synchronized around on an async device)."""
    if synchronize:
        backend.synchronize()
    start = _clock.now()
    out = func(*args, **kwargs)
    if synchronize:
        backend.synchronize()
    return out, _clock.now() - start


class _OperatorTimer(TorchDispatchMode):
    """Times each operator call, in order."""

    def __init__(self, backend: Accelerator, synchronize: bool) -> None:
        super().__init__()
        self.backend = backend
        self.synchronize = synchronize
        self.names: list[str] = []
        self.seconds: list[float] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out, seconds = timed_call(func, args, kwargs or {}, self.backend, self.synchronize)
        self.seconds.append(seconds)
        self.names.append(str(func))
        return out


def noise_of(samples: Sequence[Sequence[float]]) -> float:
    """The relative standard deviation of a median of ``samples[r][i]`` over ``r``.

    Per call, the variance of the logarithms of its samples; their median over the
    calls (robust to the calls a busy spell hit) scaled to a standard deviation.
    """
    if len(samples) < 2:
        return 0.0
    variances = [
        statistics.variance([math.log(t) for t in times])
        for times in zip(*samples, strict=True)
        if min(times) > 0
    ]
    if not variances:
        return 0.0
    sigma = math.sqrt(statistics.median(variances) / _MEDIAN_VARIANCE)
    return _MEDIAN_EFFICIENCY * sigma / math.sqrt(len(samples))


def repeated(
    model: nn.Module,
    example_inputs: Any,
    backend: Accelerator,
    names: Sequence[str],
    first: Sequence[float],
    synchronize: bool,
) -> tuple[list[float], float]:
    """Each call's median over :data:`REPEATS` forwards, and the noise (:func:`noise_of`).

    For backends whose operators run when called (not lazy ones, whose calls only
    record a graph: there the profile times modules, not calls).

    Args:
        model: The model, as the profile ran it.
        example_inputs: Its inputs, a tuple of positional arguments or a dict.
        backend: The backend it runs on.
        names: The recorded forward's operator calls, in order.
        first: Their seconds in the recorded forward.
        synchronize: Whether to synchronize around each call (an asynchronous device).

    Returns:
        The medians and the noise; ``first`` and 0.0 where another forward ran other
        calls (the data decides which operators run), as no call can be matched then.
    """
    samples = [list(first)]
    for _ in range(REPEATS - 1):
        timer = _OperatorTimer(backend, synchronize)
        with timer, dropping_saved():
            output = call_model(model, example_inputs)
        del output
        if timer.names != list(names):
            return list(first), 0.0
        samples.append(timer.seconds)
    medians = [statistics.median(times) for times in zip(*samples, strict=True)]
    return medians, noise_of(samples)
