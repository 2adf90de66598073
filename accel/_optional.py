"""The optional :class:`accel.Accelerator` members: their protocols and defaults.

An optional member is one a backend may leave out; the algorithms call it through the
function here, which uses the backend's own member where it has one and otherwise a
default that is right for every backend that was complete before the member existed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ._errors import ProtocolViolationError
from ._protocol import Accelerator, declared_members

if TYPE_CHECKING:
    import torch

__all__ = [
    "ATTENTION_KERNELS",
    "AttentionKernel",
    "CopyEngines",
    "RecomputeBarrier",
    "attention_kernel",
    "copy_engines",
    "optional_members",
    "recompute_barrier",
]


@runtime_checkable
class RecomputeBarrier(Protocol):
    """The optional member a lazy device defines to keep a recomputation a recomputation.

    A device compiler that sees the checkpointed forward and its recomputation in one
    graph may merge them (common-subexpression elimination), which keeps the forward's
    activations alive and saves nothing (pytorch/xla#3455).
    """

    def recompute_barrier(self, tensors: Sequence[torch.Tensor]) -> None:
        """Fence ``tensors``, the inputs of a recomputation, from the forward that made them.

        Called by ``checkpointing`` just before a recomputation reads ``tensors`` (the
        checkpoint's inputs and, where known, the gradients arriving at it). Afterwards
        work computed from ``tensors`` must not be merged with, or scheduled before, work
        the graph did before this call. Values are unchanged; it may update the tensors
        in place (XLA: one ``optimization_barrier_`` over all of them) and must not
        record anything autograd sees. Eager devices need nothing. Without the member,
        accel calls ``mark_step()`` (a flush is the barrier every lazy device has; on an
        eager device it does nothing).
        """


@runtime_checkable
class CopyEngines(Protocol):
    """The optional member that says how many host-device copies can run at once.

    Algorithms that move data both ways (``offload``: parameters to the device,
    gradients back) put each direction on a stream of its own only where the two can
    really overlap; on a device with one copy engine a second copy stream would only
    queue behind the first.
    """

    @property
    def copy_engines(self) -> int:
        """How many copies between host and device memory can run at the same time.

        ``0``: copies are not asynchronous (no streams; they run in order with the
        rest). ``1``: one copy at a time, overlapping compute (one copy stream is
        enough). ``2`` or more: a host-to-device and a device-to-host copy run at once
        (separate copy engines), so each direction gets a stream of its own. Reading
        it never initialises the device. Without the member, accel assumes ``1``
        where :attr:`Accelerator.supports_streams` is true, else ``0``.
        """


ATTENTION_KERNELS = (
    "math",
    "flash_attention",
    "efficient_attention",
    "cudnn_attention",
    "overrideable",
)
"""The kernel names :meth:`AttentionKernel.attention_kernel` answers with.

torch's ``torch.nn.attention.SDPBackend`` members, lower-cased: the math path, flash
attention, memory-efficient attention, cuDNN attention and a PrivateUse1 device's own
("overrideable") kernel.
"""


@runtime_checkable
class AttentionKernel(Protocol):
    """The optional member that says which attention kernel the device runs for a call.

    What ``scaled_dot_product_attention`` keeps for backward depends on the kernel: the
    math path keeps the attention probabilities (batch x heads x query x key, twice with
    dropout), the fused kernels keep their inputs, output and a log-sum-exp. The
    checkpointing planner profiles on fake tensors, where torch may choose otherwise than
    the device would (for instance when the device's rules cannot be asked where the
    planning runs), so it asks the backend.
    """

    def attention_kernel(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        enable_gqa: bool = False,
    ) -> str | None:
        """Name the kernel the device runs for this call, or ``None`` to let torch choose.

        The arguments are those of ``torch.nn.functional.scaled_dot_product_attention``;
        the tensors may be fake or meta tensors, so only their shapes, strides, dtypes,
        ``requires_grad`` and device may be read, never their values. The answer is one
        of :data:`ATTENTION_KERNELS` (what the device would run for tensors of these
        properties on its own device) or ``None``: torch's dispatcher picks the kernel
        for the tensors as given, which is right wherever that choice depends on the
        tensors alone. Never initialises the device. Without the member, accel answers
        ``None``.
        """


_OPTIONAL_MEMBERS = tuple(
    sorted(
        {
            *declared_members(RecomputeBarrier),
            *declared_members(CopyEngines),
            *declared_members(AttentionKernel),
        }
    )
)


def optional_members() -> tuple[str, ...]:
    """Return the names a backend may leave out (accel supplies a default), sorted."""
    return _OPTIONAL_MEMBERS


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
