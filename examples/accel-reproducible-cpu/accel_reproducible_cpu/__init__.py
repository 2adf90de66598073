"""``reproducible_cpu``: an accel backend for bit-reproducible CPU runs.

Results of a float reduction depend on how many threads split it, and some kernels
have nondeterministic variants. Selecting this backend (``ACCEL=reproducible_cpu``)
pins both, so the same script gives the same bits on a laptop and on a 64-core server:

* ``torch.use_deterministic_algorithms(True)``;
* ``torch.set_num_threads(N)`` with ``N`` from ``ACCEL_REPRODUCIBLE_THREADS`` (default 1).

These are process-wide settings, applied once, when the backend is created, which is
the point of choosing it; nothing happens merely because the plugin is installed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

import accel
from backends.cpu import CpuBackend

__all__ = ["THREADS_VARIABLE", "ReproducibleCpuBackend", "accel_backends"]

THREADS_VARIABLE = "ACCEL_REPRODUCIBLE_THREADS"


def _thread_count() -> int:
    raw = os.environ.get(THREADS_VARIABLE, "1").strip()
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(
            f"{THREADS_VARIABLE}={raw!r} is not a positive integer; set it to the number of "
            "CPU threads every run should use (for example 1 or 4)."
        )
    return int(raw)


class ReproducibleCpuBackend(CpuBackend):
    """The CPU backend with deterministic algorithms and a fixed intra-op thread count.

    Args:
        threads: Intra-op threads; default from ``ACCEL_REPRODUCIBLE_THREADS`` (else 1).
    """

    name = "reproducible_cpu"

    def __init__(self, threads: int | None = None) -> None:
        super().__init__()
        self.threads = _thread_count() if threads is None else threads
        torch.use_deterministic_algorithms(True)
        torch.set_num_threads(self.threads)

    def __repr__(self) -> str:
        return f"ReproducibleCpuBackend(threads={self.threads})"


def _probe() -> accel.Availability:
    try:
        _thread_count()
    except ValueError as exc:
        return accel.Availability.unavailable(str(exc))
    return accel.Availability(available=True, device_count=1)


@accel.hookimpl
def accel_backends() -> Sequence[accel.BackendSpec]:
    """Provide the ``reproducible_cpu`` backend; it is only ever chosen by name."""
    return [
        accel.BackendSpec(
            name="reproducible_cpu",
            factory=ReproducibleCpuBackend,
            probe=_probe,
            description="CPU with deterministic algorithms and a fixed thread count.",
            priority=-1,
        )
    ]
