"""The stopwatch: how much work a measurement does, and its median.

The only module of the planner that reads a clock, and only on request: when rates are
calibrated (:mod:`._calibrate`, :mod:`._operator_rates`, :mod:`._overheads`) and when a
plan is measured with ``timed=True`` (:mod:`.._measure_step`); planning never takes a
timing from here.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from accel import Accelerator

__all__ = ["SIZES", "Sizes", "best_times", "seconds", "seconds_each"]

_T = TypeVar("_T")


@dataclass(frozen=True)
class Sizes:
    """How much work each measurement does (smaller for the tests)."""

    rounds: int = 7  # timed samples per measurement; the median is taken
    matmul: int = 512  # side of the square matrix product
    image: int = 32  # side of the convolution's 8 x 64-channel images
    sequence: int = 256  # attention's sequence length (4 x 8 heads of 64)
    elements: int = 1 << 21  # elements of the pointwise operator's and random draw's tensor
    shapes: int = 3  # a model's most common shapes timed per operator
    sample_seconds: float = 2e-3  # repeat a short call within one sample to this length
    width: int = 256  # features of the reference step's transformer-like part
    short_call: float = 2.0  # calls under this many fixed costs get no say in a rate


SIZES = Sizes()


def seconds(step: Callable[[], Any], backend: Accelerator, sizes: Sizes) -> float:
    """The median seconds of one ``step`` call, after a warm-up.

    A call shorter than ``sizes.sample_seconds`` is repeated within each sample, so
    that the timer's resolution and the loop around it do not count.
    """
    start = time.perf_counter()
    step()
    backend.synchronize()
    first = time.perf_counter() - start
    repeats = max(1, min(100, math.ceil(sizes.sample_seconds / max(first, 1e-7))))
    samples = []
    for _ in range(sizes.rounds):
        start = time.perf_counter()
        for _ in range(repeats):
            step()
        backend.synchronize()
        samples.append((time.perf_counter() - start) / repeats)
    return statistics.median(samples)


def seconds_each(
    setup: Callable[[], _T], step: Callable[[_T], Any], backend: Accelerator, sizes: Sizes
) -> float:
    """The median seconds of ``step(setup())``, each sample on a fresh ``setup()``.

    For a call that changes its arguments (an in-place operator): repeated on the same
    ones its work would compound (a ``mul_`` run to infinity, a tensor grown denormal).
    ``setup`` runs outside the timing; one untimed call warms up first.
    """
    step(setup())
    samples = []
    for _ in range(sizes.rounds):
        made = setup()
        backend.synchronize()
        start = time.perf_counter()
        step(made)
        backend.synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def best_times(steps: list[Callable[[], Any]], backend: Accelerator, sizes: Sizes) -> list[float]:
    """Each step's median seconds, the steps interleaved round by round."""
    for step in steps:
        step()
    backend.synchronize()
    samples: list[list[float]] = [[] for _ in steps]
    for _ in range(sizes.rounds):
        for times, step in zip(samples, steps, strict=True):
            start = time.perf_counter()
            step()
            backend.synchronize()
            times.append(time.perf_counter() - start)
    return [statistics.median(times) for times in samples]
