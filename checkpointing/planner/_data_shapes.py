"""Which operator calls let the data decide the shape of what they return.

A module call with such an operator inside (``nonzero``, ``masked_select``, a boolean
mask's indexing, ``item``), or whose inputs were shaped by one, can save other tensors
from one step to the next (mixture-of-experts routing), so the planner gives it no grain
that relies on the saved tensors recorded once (:attr:`._records.ModuleProfile.
data_dependent`).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["decides_shape"]

_DATA_DEPENDENT = tuple(
    tag
    for tag in (
        getattr(torch.Tag, "dynamic_output_shape", None),
        getattr(torch.Tag, "data_dependent_output", None),
    )
    if tag is not None
)

_MASK_DTYPES = (torch.bool, torch.uint8)


def decides_shape(func: Any, args: Any, kwargs: dict[str, Any]) -> bool:
    """Whether the data may decide the shape of ``func``'s output, or its value a branch.

    ``aten.index.Tensor`` carries the tag for its boolean masks alone: indexed by integer
    tensors, its output takes their (broadcast) shape, whatever they hold. transformers
    builds its attention masks that way (``padding_mask[batch_idx, kv_idx]``), and the
    tag would otherwise mark every layer the mask reaches, leaving them no grain that
    relies on the recorded saved tensors.
    """
    if not any(tag in func.tags for tag in _DATA_DEPENDENT):
        return False
    if func is torch.ops.aten.index.Tensor:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(index is not None and index.dtype in _MASK_DTYPES for index in indices)
    return True
