"""The decisions a checkpoint plan makes for a module, as they appear in its table."""

from __future__ import annotations

__all__ = ["ALTERNATE", "FULL", "KEEP", "MEASURED", "SAVED", "SELECTIVE"]

KEEP = "keep"
FULL = "checkpoint"
SELECTIVE = "recompute cheap ops"
#: The operator-class grain with torchtitan's rule: every second ``aten.mm`` recomputed too.
ALTERNATE = "recompute cheap ops, every second mm"
MEASURED = "keep costly ops"
SAVED = "recompute saved"
