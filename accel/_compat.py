"""Differences between the torch releases accel supports (2.4 to 2.15), one entry each.

Algorithms call these instead of checking versions themselves.
"""

from __future__ import annotations

from typing import Any

import torch.utils.checkpoint

__all__ = ["keep_selective_cache_outside_hooks", "selective_checkpoint_api"]


def selective_checkpoint_api() -> tuple[Any, Any] | str:
    """Return torch's selective-checkpoint API, or why this torch has none.

    ``torch.utils.checkpoint.create_selective_checkpoint_contexts`` and
    ``CheckpointPolicy`` became public in torch 2.5; torch 2.4 has only a private
    form meant for ``torch.compile``.

    Returns:
        ``(create_selective_checkpoint_contexts, CheckpointPolicy)``, or a sentence
        saying that the installed torch lacks them.
    """
    create = getattr(torch.utils.checkpoint, "create_selective_checkpoint_contexts", None)
    policy = getattr(torch.utils.checkpoint, "CheckpointPolicy", None)
    if create is None or policy is None:
        return (
            f"torch {torch.__version__} has no torch.utils.checkpoint."
            "create_selective_checkpoint_contexts (added in torch 2.5); upgrade torch to "
            "2.5 or later for operator-grain checkpointing"
        )
    return create, policy


def keep_selective_cache_outside_hooks(forward_context: Any) -> None:
    """Keep the outputs a selective checkpoint caches out of saved-tensor hooks.

    torch 2.15 lets the caching mode route what it keeps through the saved-tensor hooks
    in scope (``respect_saved_tensors_hooks``; unset, it warns that this will become
    the default). A checkpoint that is itself built on those hooks must keep the
    earlier behaviour, where the cache bypasses them; older releases always did.
    """
    if hasattr(forward_context, "respect_saved_tensors_hooks"):
        forward_context.respect_saved_tensors_hooks = False
