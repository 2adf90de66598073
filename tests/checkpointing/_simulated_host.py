"""A simulated host for planner tests: every clock Python has, run by seeded noise.

Under :func:`simulated`, ``time.perf_counter``, ``time.monotonic``, ``time.time`` (and
their ``_ns`` forms) read a clock that operators advance by a model of their cost
(bytes touched, matrix-product flops, random draws dearer), scaled by seeded noise:
per-operator jitter and a load factor that jumps every few hundred operators, the way
a shared machine's does; each reading of the clock also moves it on at a random rate.
A planner that read any clock would decide differently under different seeds; one that
decides from shapes and rates decides the same. The same seed replays the same noise,
so tests that use it cannot flake.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

_MATMULS = {"mm", "addmm", "bmm", "baddbmm", "convolution", "_scaled_dot_product_flash_attention"}


class SimulatedHost(TorchDispatchMode):
    """Advance a clock by each operator's modelled cost, times seeded noise."""

    def __init__(self, seed: int, jitter: float = 0.3, load: float = 3.0) -> None:
        super().__init__()
        self.time = 0.0
        self.random = random.Random(seed)
        self.jitter = jitter
        self.most_load = load
        self.load = 1.0
        self.left = 0  # operators until the load changes

    def now(self) -> float:
        self.time += self.random.uniform(0.0, 1e-4) * self.load
        return self.time

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        tensors = [t for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)]
        seconds = 2e-6 + 1e-10 * sum(t.numel() * t.element_size() for t in tensors)
        name = func.__name__.split(".")[0]
        if name in _MATMULS and len(tensors) >= 2:
            shapes = [t.shape for t in tensors if t.dim() >= 2]
            if shapes:
                seconds += 2e-11 * math.prod(shapes[0]) * shapes[-1][-1]
        if torch.Tag.nondeterministic_seeded in func.tags:
            seconds *= 4
        if self.left <= 0:
            self.load = self.random.uniform(1.0, self.most_load)
            self.left = self.random.randint(50, 500)
        self.left -= 1
        self.time += seconds * self.load * self.random.lognormvariate(0.0, self.jitter)
        return out


@contextmanager
def simulated(seed: int, jitter: float = 0.3, load: float = 3.0) -> Iterator[SimulatedHost]:
    """Run the block on a :class:`SimulatedHost`: its clock is the planner's."""
    host = SimulatedHost(seed, jitter, load)
    names = ("perf_counter", "monotonic", "time")
    saved = {name: getattr(time, name) for name in names}
    saved_ns = {name: getattr(time, f"{name}_ns") for name in names}
    try:
        for name in names:
            setattr(time, name, host.now)
            setattr(time, f"{name}_ns", lambda: int(host.now() * 1e9))
        with host:
            yield host
    finally:
        for name in names:
            setattr(time, name, saved[name])
            setattr(time, f"{name}_ns", saved_ns[name])
