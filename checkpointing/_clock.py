"""The clock every planner measurement reads, and the seam that replaces it.

The planner times operators, steps and small calibration chains; all of them read
:func:`now`. :func:`timer` swaps the clock for a block (a test's simulated host whose
noise is seeded, a device timer): decisions can then be checked against timing noise
without depending on real time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["now", "timer"]

_clock: list[Callable[[], float]] = [time.perf_counter]


def now() -> float:
    """Seconds on the planner's clock (``time.perf_counter`` unless replaced)."""
    return _clock[-1]()


@contextmanager
def timer(clock: Callable[[], float]) -> Iterator[None]:
    """Read ``clock`` instead of ``time.perf_counter`` while the block runs."""
    _clock.append(clock)
    try:
        yield
    finally:
        _clock.pop()
