"""The profile records what the device's attention kernel saves, as the backend names it.

A CUDA GPU runs fp32 grouped-query attention through the math path (torch 2.13 and
older), which keeps two batch x heads x queries x keys float32 matrices for backward
(the softmax's output and the dropout's), and fp32 attention with equal head counts
through the memory-efficient kernel, which keeps none. The host (the CPU) runs both
through the math path. The model lives on the host here; the profile is asked for the
CUDA backend, whose rules answer without a GPU (``backends._cuda_attention``).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import accel
from accel import _compat
from accel._compat import fake_profile_unavailable
from backends.cpu import CpuBackend
from backends.cuda import CudaBackend
from checkpointing.planner._profile import profile_step

pytestmark = pytest.mark.skipif(
    fake_profile_unavailable() is not None,
    reason="attention kernels are chosen in the fake-tensor profile (torch 2.5 and later)",
)

BATCH, HEADS, LENGTH, WIDTH = 2, 4, 32, 64
MATRIX = BATCH * HEADS * LENGTH * LENGTH * 4  # one float32 attention matrix, in bytes


class _Attention(nn.Module):
    """Self-attention with 4 query heads and 2 key/value heads, dropout 0.1, causal."""

    def __init__(self, grouped: bool, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.grouped, self.size = grouped, WIDTH // HEADS
        self.query = nn.Linear(WIDTH, WIDTH, dtype=dtype)
        self.key_value = nn.Linear(WIDTH, WIDTH, dtype=dtype)  # 2 key and 2 value heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        query = self.query(x).view(batch, length, HEADS, self.size).transpose(1, 2)
        key, value = self.key_value(x).view(batch, length, 2, 2, self.size).unbind(2)
        key, value = key.transpose(1, 2), value.transpose(1, 2)
        if not self.grouped:  # the heads repeated by hand, as transformers' repeat_kv does
            key, value = key.repeat_interleave(2, 1), value.repeat_interleave(2, 1)
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, dropout_p=0.1, is_causal=True, enable_gqa=self.grouped
        )
        return out.transpose(1, 2).reshape(batch, length, WIDTH)


def _matrices(model: nn.Module, backend: Any) -> int:
    """How many float32 attention matrices the profile of ``model`` has autograd save."""
    torch.manual_seed(0)
    profile = profile_step(model, (torch.randn(BATCH, LENGTH, WIDTH),), backend)
    assert not profile.fallback, profile.fallback
    return sum(profile.storage_bytes[index] == MATRIX for index in profile.saved_by)


def test_a_cuda_profile_of_fp32_grouped_attention_counts_the_two_matrices() -> None:
    # On the host the dropout mask is a float32 matrix too (on the GPU a boolean one).
    host = _matrices(_Attention(grouped=True), CpuBackend())
    assert host == 3
    found = _matrices(_Attention(grouped=True), CudaBackend())
    assert found == (0 if _compat.EFFICIENT_ATTENTION_TAKES_GQA else 3)


def test_a_cuda_profile_of_fp32_attention_with_equal_heads_counts_none() -> None:
    assert _matrices(_Attention(grouped=False), CpuBackend()) == 3
    assert _matrices(_Attention(grouped=False), CudaBackend()) == 0


def test_the_kernel_the_backend_names_is_the_operator_the_profile_records() -> None:
    def operators(model: nn.Module, x: torch.Tensor) -> set[str]:
        profile = profile_step(model, (x,), CudaBackend())
        assert not profile.fallback, profile.fallback
        return {call.name for record in profile.modules.values() for call in record.ops}

    fp32 = operators(_Attention(grouped=False), torch.randn(BATCH, LENGTH, WIDTH))
    assert "aten._scaled_dot_product_efficient_attention.default" in fp32
    assert not any("softmax" in name for name in fp32)
    half = torch.randn(BATCH, LENGTH, WIDTH, dtype=torch.float16)
    fp16 = operators(_Attention(grouped=True, dtype=torch.float16), half)
    assert "aten._scaled_dot_product_flash_attention.default" in fp16


class _Answers(CpuBackend):
    """The host, answering every attention call with one kernel name."""

    def __init__(self, kernel: str) -> None:
        self.kernel = kernel

    def attention_kernel(self, *args: Any, **kwargs: Any) -> str | None:
        return self.kernel


def test_a_backend_answering_no_kernel_name_is_refused() -> None:
    query = torch.empty(1, 2, 4, 8, device="meta")
    with pytest.raises(accel.ProtocolViolationError, match="attention_kernel"):
        accel.attention_kernel(_Answers("fast"), query, query, query)
    assert accel.attention_kernel(CpuBackend(), query, query, query) is None
