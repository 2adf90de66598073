"""Which scaled-dot-product-attention kernel a CUDA GPU runs for a call, by torch's rules.

torch chooses the kernel in C++ (``select_sdp_backend``, ``sdp_utils.cpp``) from the
tensors and the GPU: it tries the kernels in its priority order (:func:`accel._compat.
sdp_priority_order`; by default flash, memory-efficient, math, cuDNN) and takes the first
whose constraints the call meets. Where a GPU is visible, torch itself answers, even for
fake tensors, so :func:`cuda_attention_kernel` returns ``None`` there. Without one (a
model planned on the host for a GPU, the tests), this module follows the same rules for
an NVIDIA data-centre GPU (sm80 or newer), the constraints that decide what is saved:

* flash attention: float16 or bfloat16, no mask, equal head sizes of at most 256, a
  causal call only with as many queries as keys, grouped-query attention (GQA) allowed;
* memory-efficient attention: float32 too, a mask allowed, head sizes a multiple of 4
  (float32) or 8 (16-bit); GQA and a single key/value head only from torch 2.14
  (:data:`accel._compat.EFFICIENT_ATTENTION_TAKES_GQA`);
* cuDNN attention (tried after math unless torch moved it first): 16-bit, head sizes a
  multiple of 8 of at most 128;
* math: everything else, float64 included.

Every kernel needs four-dimensional inputs with one batch size and a contiguous last
dimension; the runtime switches (``torch.backends.cuda.enable_flash_sdp`` and the
``sdpa_kernel`` context) are read. Hardware limits of older GPUs are not modelled.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from accel import _compat

__all__ = ["cuda_attention_kernel"]

_HALF = (torch.float16, torch.bfloat16)


def cuda_attention_kernel(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    enable_gqa: bool = False,
) -> str | None:
    """The kernel a CUDA GPU runs for this call, or ``None`` where torch can ask the GPU.

    See the module docstring for the rules. Reads the tensors' properties only.
    """
    if query.device.type == "cuda" and torch.cuda.device_count() > 0:
        return None
    if not _dense(query, key, value):
        return "math"
    switches = {
        "flash_attention": "flash_sdp_enabled",
        "efficient_attention": "mem_efficient_sdp_enabled",
        "cudnn_attention": "cudnn_sdp_enabled",
        "math": "math_sdp_enabled",
    }
    flags = torch.backends.cuda
    enabled = {k: bool(getattr(flags, name, lambda: False)()) for k, name in switches.items()}
    fits: dict[str, Callable[[], bool]] = {
        "flash_attention": lambda: _flash(query, key, value, attn_mask, is_causal, enable_gqa),
        "efficient_attention": lambda: _efficient(query, key, value, enable_gqa),
        "cudnn_attention": lambda: _cudnn(query, key, value, enable_gqa),
        "math": lambda: True,
    }
    for kernel in _compat.sdp_priority_order():
        if enabled.get(kernel, False) and fits[kernel]():
            return kernel
    return "math"


def _dense(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
    """Four-dimensional, one batch size, no empty sequence, a contiguous last dimension."""
    tensors = (query, key, value)
    if any(t.dim() != 4 or t.is_nested for t in tensors):
        return False
    if len({t.size(0) for t in tensors}) != 1 or query.size(2) == 0 or key.size(2) == 0:
        return False
    return all(t.stride(-1) == 1 or t.size(-1) == 1 for t in tensors)


def _heads(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, gqa: bool) -> bool:
    """Whether the kernel takes these head counts (``gqa``: it takes grouped queries)."""
    q, k, v = query.size(1), key.size(1), value.size(1)
    if q == k == v:
        return True
    return gqa and k == v and k > 0 and q % k == 0


def _flash(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    enable_gqa: bool,
) -> bool:
    size = query.size(-1)
    return (
        attn_mask is None
        and query.dtype in _HALF
        and size == key.size(-1) == value.size(-1) <= 256
        and (not is_causal or query.size(2) == key.size(2))
        and _heads(query, key, value, enable_gqa)
    )


def _efficient(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, enable_gqa: bool
) -> bool:
    if query.dtype not in (*_HALF, torch.float32):
        return False
    alignment = 8 if query.dtype in _HALF else 4
    sizes_fit = (
        query.size(-1) == key.size(-1)
        and query.size(-1) % alignment == 0
        and value.size(-1) % alignment == 0
    )
    takes_gqa = _compat.EFFICIENT_ATTENTION_TAKES_GQA
    single = takes_gqa and key.size(1) == value.size(1) == 1
    return sizes_fit and (single or _heads(query, key, value, takes_gqa and enable_gqa))


def _cudnn(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, enable_gqa: bool) -> bool:
    sizes = (query.size(-1), value.size(-1))
    return (
        query.dtype in _HALF
        and not (
            torch.are_deterministic_algorithms_enabled()
            and not torch.is_deterministic_algorithms_warn_only_enabled()
        )
        and all(size <= 128 and size % 8 == 0 for size in sizes)
        and _heads(query, key, value, enable_gqa)
    )
