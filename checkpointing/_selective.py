"""Operator-grain checkpointing: keep matmul and attention outputs, recompute the rest.

Inside a checkpointed module, a selective policy (torch's
``create_selective_checkpoint_contexts``, passed as ``context_fn``) keeps the outputs
of the operators that are expensive to recompute (matrix products, convolutions,
attention) and lets everything else (pointwise activations, dropout, normalisation,
softmax, reshapes) be recomputed in backward. The cheap operators are usually the ones
whose saved tensors take the most memory per unit of compute.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from accel._compat import keep_selective_cache_outside_hooks, selective_checkpoint_api

from ._non_reentrant import ContextFn

__all__ = ["SAVED_OPERATORS", "is_saved_operator", "selective_context_fn", "unavailable_reason"]


def _overloads(*names: str) -> frozenset[Any]:
    found: list[Any] = []
    for name in names:
        packet = getattr(torch.ops.aten, name, None)
        if packet is not None:
            found.extend(getattr(packet, overload) for overload in packet.overloads())
    return frozenset(found)


SAVED_OPERATORS = _overloads(
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "convolution",
    "_convolution",
    "_scaled_mm",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_efficient_attention_forward",
    "_flash_attention_forward",
)
"""The aten operators whose outputs a selective checkpoint keeps."""


def is_saved_operator(func: Any) -> bool:
    """Whether the selective policy keeps the output of the aten operator ``func``."""
    return func in SAVED_OPERATORS


def unavailable_reason() -> str | None:
    """Why operator-grain checkpointing cannot run with this torch, or ``None``."""
    api = selective_checkpoint_api()
    return api if isinstance(api, str) else None


def selective_context_fn() -> ContextFn:
    """Return a ``context_fn`` that keeps :data:`SAVED_OPERATORS` outputs, recomputes the rest.

    Raises:
        RuntimeError: If this torch has no selective-checkpoint API (torch 2.4).
    """
    api = selective_checkpoint_api()
    if isinstance(api, str):
        raise RuntimeError(f"checkpointing: operator-grain checkpointing is unavailable: {api}.")
    create, policy = api

    def choose(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        return policy.MUST_SAVE if func in SAVED_OPERATORS else policy.PREFER_RECOMPUTE

    def context_fn() -> Any:
        forward, recompute = create(choose)
        # Our checkpoint keeps its activations through saved-tensor hooks; the cache
        # must stay outside them, or its kept outputs would be dropped like the rest.
        keep_selective_cache_outside_hooks(forward)
        return forward, recompute

    result: Callable[[], Any] = context_fn
    return result
