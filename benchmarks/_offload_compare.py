"""fairscale's OffloadModel timed beside ours, with out-of-memory as a result, not a crash.

fairscale 0.4.13 keeps every shard's input gradient during backward, so under the cap
ours runs in (3 GiB for the default model) it needs about 3.25 GiB and runs out of
memory. bench_offload.py times ours first; then fairscale under the same cap, and, if
that runs out of memory, once more under a raised cap (more memory than ours had, so the
comparison only flatters fairscale). Each attempt's outcome is recorded.

torch's pinned host allocator rounds every request up to a power of two and keeps freed
blocks cached, so between the wrappers the host cache is emptied as well as the device's.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from accel import Accelerator

# torch.cuda.OutOfMemoryError exists on every supported release (newer ones also name the
# same class torch.OutOfMemoryError).
T = TypeVar("T")

OUT_OF_MEMORY: tuple[type[BaseException], ...] = (torch.cuda.OutOfMemoryError,)


def empty_host_cache() -> str:
    """Return cached pinned host blocks to the system; name the call used, or ``"none"``."""
    # Newest first: torch.accelerator's public call, then the private ones before it.
    for owner, name in (("accelerator", "empty_host_cache"), ("_C", "_accelerator_emptyHostCache"),
                        ("_C", "_host_emptyCache")):  # fmt: skip
        release = getattr(getattr(torch, owner, None), name, None)
        if not callable(release):
            continue
        try:
            release()
        except RuntimeError:  # no accelerator (a CPU build): nothing is cached
            return "none: no accelerator"
        return f"torch.{owner}.{name}"
    return "none"


def release_memory(backend: Accelerator) -> str:
    """Collect garbage, then empty the device cache and the pinned host cache."""
    gc.collect()
    backend.synchronize()
    backend.empty_cache()
    return empty_host_cache()


def time_under_caps(
    caps_gib: list[float],
    build: Callable[[], Any],
    time_steps: Callable[[Any], T],
    set_cap: Callable[[float], None],
    release: Callable[[], object],
) -> tuple[T | None, dict[str, Any]]:
    """Build and time a model under each cap in turn until one run does not run out of memory.

    Returns:
        The step times (``None`` if every cap ran out of memory) and a record of every
        attempt: ``{"result": ..., "attempts": [{"cap_gib", "outcome", "error"?}]}``.
    """
    attempts: list[dict[str, Any]] = []
    for cap in caps_gib:
        set_cap(cap)
        error = ""
        try:
            model = build()
            times: T | None = time_steps(model)
        except OUT_OF_MEMORY as exc:
            error = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else repr(exc)
            times = None
        model = None
        release()
        if times is not None:
            attempts.append({"cap_gib": cap, "outcome": "timed"})
            first = attempts[0]["cap_gib"]
            result = "timed" if cap == first else (
                f"out of memory under the {first:g} GiB cap; timed under {cap:g} GiB"
            )  # fmt: skip
            return times, {"result": result, "attempts": attempts}
        attempts.append({"cap_gib": cap, "outcome": "out of memory", "error": error})
    caps = ", ".join(f"{cap:g}" for cap in caps_gib)
    return None, {
        "result": f"out of memory under every cap tried ({caps} GiB)",
        "attempts": attempts,
    }


def speedup_target(
    theirs: float | None, ours: float, record: dict[str, Any], wanted: float
) -> dict[str, Any]:
    """The throughput-against-fairscale target; ``met`` is ``None`` when nothing compares."""
    note = "" if record["result"] == "timed" else f"fairscale: {record['result']}"
    if theirs is None:
        return {"value": None, "target": wanted, "met": None, "note": note}
    value = theirs / ours
    return {"value": value, "target": wanted, "met": value >= wanted, "note": note}
