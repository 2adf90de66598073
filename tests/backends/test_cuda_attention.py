"""The CUDA backend's attention kernel rule, asked on the host (no GPU needed).

The tensors are meta tensors: the rule reads their shapes, dtypes and strides only, as
it does for the planner's fake tensors. Where a GPU is visible the backend answers
``None`` for tensors on it (torch asks the GPU itself), which needs a GPU to check.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import accel
from accel import _compat
from backends.cuda import CudaBackend

BACKEND = CudaBackend()


def _tensor(
    batch: int, heads: int, length: int, size: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    return torch.empty(batch, heads, length, size, device="meta", dtype=dtype).requires_grad_()


def _kernel(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **kwargs: Any) -> Any:
    return accel.attention_kernel(BACKEND, query, key, value, **kwargs)


def test_fp32_grouped_query_attention_with_dropout_runs_the_math_path_until_2_14() -> None:
    # transformers' Llama in fp32 on a GPU: 4 query heads, 2 key/value heads, head size
    # 256, attention dropout, causal. Flash attention needs 16-bit inputs; the
    # memory-efficient kernel takes grouped heads only from torch 2.14.
    query, key = _tensor(8, 4, 1024, 256), _tensor(8, 2, 1024, 256)
    found = _kernel(query, key, key, dropout_p=0.1, is_causal=True, enable_gqa=True)
    expected = "efficient_attention" if _compat.EFFICIENT_ATTENTION_TAKES_GQA else "math"
    assert found == expected


def test_fp32_with_the_heads_repeated_runs_memory_efficient_attention() -> None:
    # The zoo's Qwen2: key/value heads repeated by hand, so all head counts agree.
    query = _tensor(8, 8, 1024, 128)
    assert _kernel(query, query, query, dropout_p=0.1, is_causal=True) == "efficient_attention"
    mask = torch.empty(8, 1, 1024, 1024, device="meta", dtype=torch.bool)
    assert _kernel(query, query, query, attn_mask=mask, dropout_p=0.1) == "efficient_attention"


def test_16_bit_inputs_run_flash_attention_unless_a_mask_or_uneven_causal_call() -> None:
    for dtype in (torch.float16, torch.bfloat16):
        query = _tensor(2, 8, 128, 64, dtype)
        assert _kernel(query, query, query, dropout_p=0.1, is_causal=True) == "flash_attention"
        grouped = _tensor(2, 2, 128, 64, dtype)
        found = _kernel(query, grouped, grouped, is_causal=True, enable_gqa=True)
        assert found == "flash_attention"
        mask = torch.empty(2, 1, 128, 128, device="meta", dtype=torch.bool)
        assert _kernel(query, query, query, attn_mask=mask) == "efficient_attention"
        longer = _tensor(2, 8, 256, 64, dtype)
        assert _kernel(query, longer, longer, is_causal=True) == "efficient_attention"
        wide = _tensor(2, 8, 128, 512, dtype)  # over flash attention's 256
        assert _kernel(wide, wide, wide) == "efficient_attention"


def test_what_no_fused_kernel_takes_runs_the_math_path() -> None:
    double = _tensor(2, 4, 16, 64, torch.float64)
    assert _kernel(double, double, double) == "math"
    odd = _tensor(2, 4, 16, 30)  # fp32 head size not a multiple of 4
    assert _kernel(odd, odd, odd) == "math"
    three_d = torch.empty(2, 16, 64, device="meta")
    assert _kernel(three_d, three_d, three_d) == "math"
    strided = _tensor(2, 4, 16, 64).transpose(-1, -2)  # last dimension not contiguous
    assert _kernel(strided, strided, strided) == "math"


def test_the_sdpa_kernel_context_is_followed() -> None:
    query = _tensor(2, 8, 128, 64, torch.float16)
    with sdpa_kernel([SDPBackend.MATH]):
        assert _kernel(query, query, query) == "math"
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        assert _kernel(query, query, query) == "efficient_attention"
    assert _kernel(query, query, query) == "flash_attention"


@pytest.mark.skipif(torch.cuda.device_count() == 0, reason="needs a visible CUDA GPU")
def test_on_a_visible_gpu_torch_answers() -> None:
    query = torch.empty(2, 4, 16, 64, device="cuda")
    assert _kernel(query, query, query) is None
