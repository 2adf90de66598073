"""Fused attention priced by its products and its scores (issue 40).

The host CPU's fused kernel (``_scaled_dot_product_flash_attention_for_cpu``) and a
PrivateUse1 device's (``..._fused_attention_overrideable``) have no formula in
``flop_counter``: they were priced by their bytes alone, a tenth of their time. Their
flops are now counted as torch counts its other kernels', and every fused kernel also
records its scores (query-key pairs), whose softmax the rates price apart: with 8-wide
heads it, not the products, takes most of the kernel's time.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from torch import nn

from checkpointing import profile_step
from checkpointing.planner import builtin_rates
from checkpointing.planner._calibration._calibrate import attention_fit
from checkpointing.planner._pricing import op_seconds
from checkpointing.planner._tables import CPU_TABLES
from checkpointing.planner._work import ATTENTION, attention_flops, attention_scores, op_work

aten = torch.ops.aten


class _Attention(nn.Module):
    """Self-attention on ``(batch, heads, length, width)`` inputs, no dropout."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.project = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.project(x)
        return nn.functional.scaled_dot_product_attention(q, q, q).sum()


def _qkv(batch: int, heads: int, kv_heads: int, length: int, width: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    shapes = [(batch, heads, length, width), *[(batch, kv_heads, length + 3, width)] * 2]
    return [torch.randn(*shape, generator=generator) for shape in shapes]


def test_the_cpu_kernel_is_recorded_with_its_flops_and_scores() -> None:
    x = torch.randn(2, 4, 32, 8, requires_grad=True)
    recorded = profile_step(_Attention(8), (x,), backend="cpu")
    forward = [w for w in recorded.forward if w.kind == ATTENTION]
    backward = [w for w in recorded.backward if w.kind == ATTENTION]
    assert [w.operator for w in forward] == [
        "aten._scaled_dot_product_flash_attention_for_cpu.default"
    ]
    pairs = 2 * 4 * 32 * 32
    # Two products forward (scores, then values); five backward (the scores again, the
    # gradients of probabilities and values, then of queries and keys).
    assert (forward[0].flops, forward[0].scores) == (2 * pairs * (8 + 8), pairs)
    if recorded.fallback:
        # Profiled on real tensors (every model on torch 2.4): no backward is recorded,
        # and the forward's is estimated from it (two products for a product).
        assert backward == []
        return
    assert [w.operator for w in backward] == [
        "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"
    ]
    assert (backward[0].flops, backward[0].scores) == (2 * pairs * (3 * 8 + 2 * 8), 2 * pairs)


def test_the_count_is_torchs_for_its_other_kernels_and_grouped_heads_count_the_querys() -> None:
    from torch.utils.flop_counter import flop_registry

    q, k, v = _qkv(2, 8, 2, 16, 8)
    func = aten._scaled_dot_product_flash_attention_for_cpu.default
    pairs = 2 * 8 * 16 * 19
    assert attention_scores(func, (q, k, v)) == pairs
    assert attention_flops(func, (q, k, v)) == 2 * pairs * 16
    # torch's formula for the efficient kernel, on the same shapes (no grouped heads:
    # its formula may predate them).
    q, k, v = _qkv(2, 4, 4, 16, 8)
    efficient = flop_registry[aten._scaled_dot_product_efficient_attention]
    counted = efficient(q, k, v, None, False, out_val=None)
    assert attention_flops(func, (q, k, v)) == counted
    backward = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    grad = torch.randn_like(q)
    assert attention_scores(backward, (grad, q, k, v)) == 2 * attention_scores(func, (q, k, v))
    # Any other call records none.
    assert attention_scores(aten.mm.default, (q[0, 0], k[0, 0].T)) == 0
    assert attention_flops(aten.mm.default, (q[0, 0], k[0, 0].T)) == 0


def test_a_fused_call_is_priced_by_its_flops_and_scores_not_as_a_random_draw() -> None:
    q, k, v = _qkv(2, 4, 4, 64, 8)
    func = aten._scaled_dot_product_flash_attention_for_cpu.default
    out = func(q, k, v)
    work = op_work(func, (q, k, v), {}, out, out[0].numel() * 4)
    # The kernel takes a dropout probability, so torch tags it as drawing.
    assert work.random and work.kind == ATTENTION
    rates = dataclasses.replace(builtin_rates("cpu"), attention_score_seconds=1e-9)
    expected = work.flops / rates.attention_flops + work.scores * 1e-9 + rates.call_seconds
    assert op_seconds(work, rates) == pytest.approx(expected, rel=1e-12)
    # Rates without a score cost (a file written before it) price the flops alone.
    plain = dataclasses.replace(rates, attention_score_seconds=0.0)
    assert op_seconds(work, plain) == pytest.approx(
        work.flops / rates.attention_flops + rates.call_seconds, rel=1e-12
    )


@pytest.mark.parametrize(("rate", "per_score"), [(1.5e11, 6e-10), (4e10, 2e-9), (1e12, 1e-11)])
def test_the_fit_recovers_the_rate_and_the_score_cost_of_two_timings(
    rate: float, per_score: float
) -> None:
    scores = 4 * 8 * 256 * 256

    def timed(width: int) -> float:
        return 4 * scores * width / rate + scores * per_score

    fitted = attention_fit(scores, 64, 8, timed(64), timed(8))
    assert fitted == pytest.approx((rate, per_score), rel=1e-9)


@pytest.mark.parametrize(
    "times",
    [
        (4e-3, 0.5e-3),  # narrow heads no slower per flop: one rate, no score cost
        (4e-3, 4e-3),  # the same time: the timings do not tell
        (3e-3, 4e-3),  # narrow heads slower than wide: noise
    ],
)
def test_timings_that_show_no_score_cost_keep_one_rate(times: Any) -> None:
    scores = 1000
    wide, narrow = times
    assert attention_fit(scores, 64, 8, wide, narrow) == (4 * scores * 64 / wide, 0.0)


def test_the_table_prices_the_cpu_kernel_at_small_heads_as_the_host_measured() -> None:
    # The UNet's attention (8 x 8 heads of 256 positions, 8 wide) measured 3.5 ms
    # forward and 8.2 ms backward on the host the Xeon table comes from; priced by its
    # bytes it was 0.86 ms and 0.15 ms. Within 30% now.
    rates = CPU_TABLES[0].rates  # the Xeon table, whichever host runs the test
    q = torch.empty(8, 8, 256, 8)
    func = aten._scaled_dot_product_flash_attention_for_cpu.default
    backward = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    forward = attention_flops(func, (q, q, q)) / rates.attention_flops
    forward += attention_scores(func, (q, q, q)) * rates.attention_score_seconds
    back = attention_flops(backward, (q, q, q, q)) / rates.attention_flops
    back += attention_scores(backward, (q, q, q, q)) * rates.attention_score_seconds
    assert forward == pytest.approx(3.5e-3, rel=0.3)
    assert back == pytest.approx(8.2e-3, rel=0.3)
