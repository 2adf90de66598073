"""The decisions a checkpoint plan makes for a module, as they appear in its table."""

from __future__ import annotations

__all__ = ["FULL", "KEEP", "MEASURED", "SAVED", "SELECTIVE"]

KEEP = "keep"
FULL = "checkpoint"
SELECTIVE = "recompute cheap ops"
MEASURED = "keep costly ops"
SAVED = "recompute saved"
