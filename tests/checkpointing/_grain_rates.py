"""Rates under which the saved-tensor grain's machinery costs nothing, for its tests.

The planner prices the grain's hooks, replays, packed masks and its own cost per call
as the device measures them, and on the small models of the tests it then often
prefers a whole checkpoint.
The tests of the grain itself (exactness, fake against real, files, compiled forms)
plan with these rates, so that the search takes the grain wherever it fits; what the
grain really costs is the cost model's own tests' and the benchmarks' business.

Likewise a checkpoint's own cost (``region_seconds``, 0.25 ms a call on a CPU, and
``region_tensor_seconds`` per tensor it saves) outweighs
recomputing any one call of a test-sized model, whose plans then take one large region.
Tests of plans that nest regions plan with :data:`REGIONS_FREE`.
"""

from __future__ import annotations

from dataclasses import replace

from checkpointing.planner import builtin_rates

#: The built-in host rates with the saved-tensor grain's machinery free.
SAVED_GRAIN_FREE = replace(
    builtin_rates("cpu"),
    hook_seconds=0.0,
    replay_seconds=0.0,
    pack_bytes=1e15,
    saved_call_seconds=0.0,
)

#: The built-in host rates with a checkpointed call's own cost free, per call and per
#: tensor it saves.
REGIONS_FREE = replace(builtin_rates("cpu"), region_seconds=0.0, region_tensor_seconds=0.0)
