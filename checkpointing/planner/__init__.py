"""The memory-budget planner: the fastest checkpointing that fits a memory budget.

Its modules are its stages, in the order :func:`plan_checkpointing` runs them:
``_profile`` (one step on fake tensors), ``_cost`` (seconds from FLOPs and bytes at a
device's rates; ``_calibrate`` measures and caches the rates, on request), ``_options``
(the ways to checkpoint each module call, with ``_saved_grain`` and ``_kept_ops``),
``_search`` (the combination that fits in the least time) and ``_plan`` (the plan:
print, save, load, apply; ``_store`` writes its JSON); ``_agree`` gives every rank of a
``torch.distributed`` group rank 0's plan.
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
