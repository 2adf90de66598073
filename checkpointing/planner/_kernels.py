"""The device's own attention kernel in the profile, chosen through the backend.

What ``scaled_dot_product_attention`` keeps for backward depends on its kernel: the math
path keeps the attention probabilities (batch x heads x queries x keys, and the dropped
ones too under dropout), a fused kernel its inputs, output and a log-sum-exp. On fake
tensors torch chooses from the tensors alone, which is not always what the device
chooses: a device whose rules torch cannot ask where the planning runs (a model planned
on the host for an accelerator) has them answered by its backend instead
(:func:`accel.attention_kernel`). While the profile's fake step runs, :class:`DeviceKernels`
sends each attention call the backend names a kernel for to that kernel's aten operator,
prepared as torch prepares it (a boolean mask made additive; memory-efficient
attention's bias expanded and padded to 16 keys; flash attention's head size padded to
8), so that the profile records what that kernel saves. A backend without the member,
or answering ``None``, leaves the call to torch.
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

import accel
from accel import Accelerator, AttentionKernel

__all__ = ["DeviceKernels", "device_kernels"]

_ATTENTION = torch.nn.functional.scaled_dot_product_attention
_PARAMETERS = (
    *("query", "key", "value", "attn_mask"),
    *("dropout_p", "is_causal", "scale", "enable_gqa"),
)
_DEFAULTS: dict[str, Any] = {
    "attn_mask": None,
    "dropout_p": 0.0,
    "is_causal": False,
    "scale": None,
    "enable_gqa": False,
}


def device_kernels(backend: Accelerator) -> AbstractContextManager[Any]:
    """A :class:`DeviceKernels` mode for ``backend``, or nothing where it has no say."""
    return DeviceKernels(backend) if isinstance(backend, AttentionKernel) else nullcontext()


class DeviceKernels(TorchFunctionMode):
    """Runs each attention call through the kernel ``backend`` names for it."""

    def __init__(self, backend: Accelerator) -> None:
        super().__init__()
        self.backend = backend

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is not _ATTENTION:
            return func(*args, **kwargs)
        call = {**_DEFAULTS, **dict(zip(_PARAMETERS, args, strict=False)), **kwargs}
        kernel = accel.attention_kernel(
            self.backend,
            call["query"],
            call["key"],
            call["value"],
            call["attn_mask"],
            call["dropout_p"],
            call["is_causal"],
            call["enable_gqa"],
        )
        if kernel is None:
            return func(*args, **kwargs)
        return _run(kernel, call, host=self.backend.device_type == "cpu")


def _run(kernel: str, call: dict[str, Any], host: bool) -> Any:
    """The attention output of ``kernel`` on ``call``'s arguments, as torch would run it."""
    aten = torch.ops.aten
    query, key, value = call["query"], call["key"], call["value"]
    dropout, causal, scale = call["dropout_p"], call["is_causal"], call["scale"]
    mask = _additive(call["attn_mask"], query.dtype)
    if kernel == "math":
        result = aten._scaled_dot_product_attention_math(
            query,
            key,
            value,
            mask,
            dropout,
            causal,
            None,
            scale=scale,
            enable_gqa=call["enable_gqa"],
        )
        return result[0]
    if kernel == "efficient_attention":
        bias = None if mask is None else _efficient_bias(mask, query, key)
        grad = query.requires_grad or key.requires_grad or value.requires_grad
        return aten._scaled_dot_product_efficient_attention(
            query, key, value, bias, grad, dropout, causal, scale=scale
        )[0]
    if kernel == "flash_attention" and host:
        return aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, dropout, causal, attn_mask=mask, scale=scale
        )[0]
    if kernel == "flash_attention":
        size = query.size(-1)
        scale = 1.0 / math.sqrt(size) if scale is None else scale
        pad = (8 - size % 8) % 8
        if pad:
            query, key, value = (torch.nn.functional.pad(t, (0, pad)) for t in (query, key, value))
        out = aten._scaled_dot_product_flash_attention(
            query, key, value, dropout, causal, False, scale=scale
        )[0]
        return out[..., :size] if pad else out
    grad = query.requires_grad or key.requires_grad or value.requires_grad
    if kernel == "cudnn_attention":
        return aten._scaled_dot_product_cudnn_attention(
            query, key, value, mask, grad, dropout, causal, False, scale=scale
        )[0]
    return aten._scaled_dot_product_fused_attention_overrideable(
        query, key, value, mask, dropout, causal, False, scale=scale
    )[0]


def _additive(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A boolean mask as the additive one torch makes of it (``-inf`` where it is false)."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros_like(mask, dtype=dtype).masked_fill_(mask.logical_not(), -math.inf)


def _efficient_bias(mask: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """The bias memory-efficient attention takes: batch x heads x queries x keys.

    A key count that is not a multiple of 16 is padded (a new, whole bias, sliced back);
    a bias with a stride that is not a multiple of 16 is made contiguous.
    """
    shape = (query.size(0), query.size(1), query.size(2), key.size(2))
    bias = mask.expand(shape)
    keys = shape[-1]
    if keys % 16:
        padded = torch.nn.functional.pad(bias, (0, 16 - keys % 16))
        return padded[..., :keys]
    if any(stride % 16 for stride in bias.stride()[:-1]):
        return bias.contiguous()
    return bias
