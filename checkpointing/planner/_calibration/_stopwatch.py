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

import torch

from accel import Accelerator

__all__ = ["SIZES", "Sizes", "best_times", "cold_seconds", "seconds"]

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
    evict_ratio: float = 2.0  # bytes written before a cold sample, per byte the call moves


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


def cold_seconds(
    setup: Callable[[], _T],
    step: Callable[[_T], Any],
    moved: int,
    backend: Accelerator,
    sizes: Sizes,
) -> float:
    """The median seconds of one ``step(setup())`` call, its inputs no longer cached.

    Repeated on the same tensors, a call finds them in the caches its last run left
    them in; in a training step, other calls have moved about as many bytes through
    the caches since its inputs were written. So before each sample, ``sizes.evict_ratio``
    times the call's own ``moved`` bytes are written, and one call is timed. On this
    workplace's CPU machine (a Xeon, 2 MiB of L2 a core), ``torch.profiler`` measured
    19 zoo families' pointwise calls in their real steps at a median 1.35 times what
    rates timed on repeated calls priced them at, and 0.94 times what rates timed
    this way do (``benchmarks/bench_pointwise.py``). Writing one or four times the
    call's bytes priced eight families' pointwise work within 0.04 of each other;
    writing 64 MiB, far more than a step moves between two calls, priced six families'
    at 1.6 to 3.1 times what it took.

    ``setup`` runs before the writing, outside the timing; one untimed call warms up.
    Each sample is on what its own ``setup()`` made: a call that changes its arguments
    (an in-place operator) gets fresh ones, or its work would compound (a ``mul_`` run
    to infinity, a tensor grown denormal); others may return the same ones each time.
    """
    buffer = torch.zeros(max(1, int(sizes.evict_ratio * moved) // 4), device=backend.device())
    step(setup())
    samples = []
    for _ in range(sizes.rounds):
        made = setup()
        _evict(buffer)
        backend.synchronize()
        start = time.perf_counter()
        step(made)
        backend.synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _evict(buffer: torch.Tensor) -> None:
    """Write all of ``buffer``, which pushes what the caches held out of them."""
    buffer.add_(1.0)


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
