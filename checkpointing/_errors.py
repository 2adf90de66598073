"""The error raised when a recomputation does not match its forward."""

from __future__ import annotations

import torch.utils.checkpoint

__all__ = ["CheckpointError", "plan_mismatch"]

CheckpointError = torch.utils.checkpoint.CheckpointError
"""torch's own class, re-exported: a recomputation that does not match its forward.

The non-reentrant variant runs torch's checkpoint, whose mismatch errors (count, shape,
dtype, device, a saved tensor unpacked twice) keep torch's type and wording, so
``except checkpointing.CheckpointError`` and ``except
torch.utils.checkpoint.CheckpointError`` are the same clause. It derives from
:class:`RuntimeError`.
"""


def plan_mismatch(subject: str, owner: str, problem: str, remedy: str = "") -> CheckpointError:
    """The error for a module whose forward no longer matches its checkpoint plan.

    ``subject`` is what was compared ("operators", "saved tensors"); ``problem`` says
    which one differs and how; ``remedy`` is appended to the advice to replan.
    """
    return CheckpointError(
        f"checkpointing: the {subject} of {owner or 'the model'} no longer match its "
        f"checkpoint plan: {problem}, so recomputing from the plan would not give this "
        "forward's values. Make a new plan with plan_checkpointing for this model and "
        f"these inputs{remedy}."
    )
