"""The memory-budget planner: the fastest checkpointing that fits a memory budget.

Its modules are its stages, in the order :func:`plan_checkpointing` (``_planning``)
runs them: ``_profile`` records one step on fake tensors into ``_records`` (laid out
as the device's kernels lay them out, ``_layouts``; a model sharded with FSDP2 as each
rank computes it, ``_sharded``; leaving nothing behind, ``_leftovers``); ``_cost``
prices each operator call from FLOPs and bytes at a device's rates; ``_options`` lists
the ways to checkpoint each module call (with ``_saved_grain`` and ``_kept_ops``);
``_search`` finds the combination that fits in the least time; ``_plan`` is the plan
(print, apply; ``_signature`` checks what it is applied to, ``_store`` writes its JSON);
``_agree`` gives every rank of a ``torch.distributed`` group rank 0's plan. On request
only, ``_calibrate`` measures and caches a device's rates (with ``_stopwatch``, the one
module that reads a clock, and ``_operator_rates`` for a model's own operators).
"""

from __future__ import annotations

from ._calibrate import calibrate_rates, default_rates, rates_cache_path
from ._cost import DeviceRates, builtin_rates
from ._plan import CheckpointPlan, ConsideredPlan, PlanRow
from ._planning import plan_checkpointing

__all__ = [
    "CheckpointPlan",
    "ConsideredPlan",
    "DeviceRates",
    "PlanRow",
    "builtin_rates",
    "calibrate_rates",
    "default_rates",
    "plan_checkpointing",
    "rates_cache_path",
]
