"""The decisions a checkpoint plan makes for a module, as they appear in its table.

The values are also what saved plan files hold: a name may change, a value may not.
"""

from __future__ import annotations

__all__ = ["ALTERNATE", "CHOSEN", "FULL", "KEEP", "OFFLOADED", "SAVED", "SELECTIVE"]

KEEP = "keep"
FULL = "checkpoint"
SELECTIVE = "recompute cheap ops"
#: The operator-class grain with torchtitan's rule: every second ``aten.mm`` recomputed too.
ALTERNATE = "recompute cheap ops, every second mm"
#: The chosen-calls grain: keep the operator calls the planner chose from the profile
#: (the most recompute time saved per byte kept), recompute the rest.
CHOSEN = "keep costly ops"
SAVED = "recompute saved"
#: The offload grain: the call's saved activations wait in pinned host memory.
OFFLOADED = "offload saved"
