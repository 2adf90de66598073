"""The error raised when a recomputation does not match its forward."""

from __future__ import annotations

import torch.utils.checkpoint

__all__ = ["CheckpointError"]

#: torch's own class, re-exported: the non-reentrant variant runs torch's checkpoint,
#: whose mismatch errors (count, shape, dtype, device, a saved tensor unpacked twice)
#: keep torch's type and wording, so ``except checkpointing.CheckpointError`` and
#: ``except torch.utils.checkpoint.CheckpointError`` are the same clause. It derives
#: from :class:`RuntimeError`.
CheckpointError = torch.utils.checkpoint.CheckpointError
