"""Defaults for the optional :class:`accel.Accelerator` members.

An optional member is one a backend may leave out; the algorithms call it through the
function here, which uses the backend's own member where it has one and otherwise a
default that is right for every backend that was complete before the member existed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ._errors import ProtocolViolationError
from ._protocol import (
    ATTENTION_KERNELS,
    Accelerator,
    AttentionKernel,
    CopyEngines,
    RecomputeBarrier,
)

if TYPE_CHECKING:
    import torch

__all__ = ["attention_kernel", "copy_engines", "recompute_barrier"]


def recompute_barrier(backend: Accelerator, tensors: Sequence[torch.Tensor]) -> None:
    """Fence a recomputation's inputs from the forward, through ``backend``.

    Calls ``backend.recompute_barrier(tensors)`` where the backend defines it
    (:class:`accel.RecomputeBarrier`). Otherwise calls ``backend.mark_step()``, what
    checkpointing did before the member existed: on a lazy backend the forward then runs
    as a graph of its own, which no compiler can merge with the recomputation; on an
    eager backend ``mark_step`` does nothing.

    Args:
        backend: The backend the recomputation runs on.
        tensors: The recomputation's tensor inputs (and the gradients arriving at it,
            where known). Non-tensors must already be filtered out.
    """
    if isinstance(backend, RecomputeBarrier):
        backend.recompute_barrier(list(tensors))
    else:
        backend.mark_step()


def copy_engines(backend: Accelerator) -> int:
    """Return how many host-device copies can run at once on ``backend``'s device.

    ``backend.copy_engines`` where the backend defines it (:class:`accel.CopyEngines`);
    otherwise ``1`` for a backend with streams and ``0`` for one without, which keeps
    what algorithms did before the member existed (one copy stream, or copies in order).

    Args:
        backend: The backend to ask.

    Returns:
        A non-negative count; never above ``0`` where ``supports_streams`` is false.

    Example::

        import accel

        assert accel.copy_engines(accel.get_backend("cpu")) == 0
    """
    if not backend.supports_streams:
        return 0
    engines = backend.copy_engines if isinstance(backend, CopyEngines) else 1
    return max(0, int(engines))


def attention_kernel(
    backend: Accelerator,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    enable_gqa: bool = False,
) -> str | None:
    """Return the attention kernel ``backend``'s device runs for this call, or ``None``.

    ``backend.attention_kernel(...)`` where the backend defines it
    (:class:`accel.AttentionKernel`); otherwise ``None``: torch's dispatcher chooses for
    the tensors as given, which is what every backend did before the member existed.
    The arguments are those of ``torch.nn.functional.scaled_dot_product_attention``
    (fake or meta tensors are fine: only their properties are read).

    Args:
        backend: The backend to ask.
        query: The query, batch x heads x query length x head size.
        key: The key, batch x key heads x key length x head size.
        value: The value, batch x key heads x key length x value head size.
        attn_mask: The mask, or ``None``.
        dropout_p: The dropout probability.
        is_causal: Whether the attention is causal.
        enable_gqa: Whether key and value may have fewer heads than the query.

    Returns:
        One of :data:`accel.ATTENTION_KERNELS`, or ``None``.

    Raises:
        ProtocolViolationError: If the backend's member answers something else.
    """
    if not isinstance(backend, AttentionKernel):
        return None
    kernel = backend.attention_kernel(
        query, key, value, attn_mask, dropout_p, is_causal, enable_gqa
    )
    if kernel is not None and kernel not in ATTENTION_KERNELS:
        raise ProtocolViolationError(
            f"accel: backend {backend.name!r} answered attention_kernel() with "
            f"{kernel!r}, expected None or one of {', '.join(ATTENTION_KERNELS)}. Fix the "
            "backend's attention_kernel, or remove it to let torch choose."
        )
    return kernel
