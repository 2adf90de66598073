"""OffloadModel's device memory is allocated once and reused: no churn under a cap.

Each of the two slice buffers holds, per dtype, the parameters of the largest slice
that uses it and their gradients; backward accumulates into the same gradient memory
every step, and the slices left in the buffers at the end of forward are not loaded
again for backward. The host cannot show an allocator's retries, so these tests count
the allocations offload queues on its copy streams (with the clock streams of
``tests/offload/_offload_streamed.py``) and check where gradients live while backward
accumulates them; every result is compared bit for bit with the plain model.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _offload_streamed import StreamedCpu, Timeline
from torch import nn

from offload import OffloadModel
from offload._model.residency import Residency

pytestmark = pytest.mark.usefixtures("copies")


class Unused(nn.Module):
    """A linear layer with a parameter that forward never uses (its .grad stays None)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.spare = nn.Parameter(torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


def make() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.Tanh(), Unused(), nn.Linear(8, 8), Unused())


def batches() -> list[torch.Tensor]:
    return [torch.randn(4, 8, generator=torch.Generator().manual_seed(k)) for k in range(3)]


def run(model: nn.Module, timeline: Timeline | None = None, zero: bool = True) -> list[Any]:
    """Three steps of SGD; losses, then every parameter and gradient (None kept)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    out: list[Any] = []
    for k, x in enumerate(batches()):
        if timeline is not None:
            with timeline:
                loss = model(x).square().mean()
                loss.backward()
        else:
            loss = model(x).square().mean()
            loss.backward()
        out.append(loss.detach())
        out += [None if p.grad is None else p.grad.clone() for p in model.parameters()]
        if k != 1 or zero:  # step 2 accumulates into step 1's gradients
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return out + [p.detach().clone() for p in model.parameters()]


def same(got: list[Any], expected: list[Any]) -> bool:
    return len(got) == len(expected) and all(
        (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))
        for a, b in zip(got, expected, strict=True)
    )


@pytest.mark.parametrize("zero", [True, False], ids=["zeroed", "accumulated"])
def test_gradients_accumulate_in_fixed_memory_and_match(zero: bool) -> None:
    expected = run(make(), zero=zero)
    timeline = Timeline()
    model = OffloadModel(make(), num_slices=3, backend=StreamedCpu(timeline))
    buffers = model._strategy.residency._buffers
    where: list[int] = []
    for parameter in model.parameters():
        parameter.register_post_accumulate_grad_hook(
            lambda p: where.append(p.grad.untyped_storage().data_ptr())
        )
    got = run(model, timeline, zero=zero)
    assert same(got, expected)  # spare.grad is None, as in the plain model
    assert model.module[2].spare.grad is None
    gradient_memory = {b.grads[torch.float32].untyped_storage().data_ptr() for b in buffers}
    assert where and set(where) <= gradient_memory, "backward accumulated outside the buffers"


def test_no_device_allocation_after_the_first_step() -> None:
    timeline = Timeline()
    model = OffloadModel(make(), num_slices=3, backend=StreamedCpu(timeline))
    transfers = model._strategy.config.transfers
    x = batches()[0]
    with timeline:
        model(x).square().mean().backward()
    buffers = model._strategy.residency._buffers
    first = [
        (b.tensors[torch.float32].data_ptr(), b.grads[torch.float32].data_ptr()) for b in buffers
    ]
    copy_streams = {transfers.stream.id, transfers.store_stream.id}
    before = [a for a in timeline.allocations if a[0] in copy_streams]
    assert before, "the first step allocated no buffer on a copy stream"
    for _ in range(2):  # gradients accumulate: the host ones are loaded, into the buffers
        with timeline:
            model(x).square().mean().backward()
    after = [a for a in timeline.allocations if a[0] in copy_streams]
    assert after == before, "offload allocated device memory on a copy stream after step 1"
    again = [
        (b.tensors[torch.float32].data_ptr(), b.grads[torch.float32].data_ptr()) for b in buffers
    ]
    assert again == first


def test_the_last_slices_of_forward_are_not_loaded_again(monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[int] = []
    issue = Residency._issue

    def counting(self: Residency, index: int, *, grads: bool) -> None:
        if self._buffers[self._parity(index)].holder != index:
            loads.append(index)
        issue(self, index, grads=grads)

    monkeypatch.setattr(Residency, "_issue", counting)
    expected = run(make())
    model = OffloadModel(make(), num_slices=3, backend=StreamedCpu(Timeline()))
    loss = model(batches()[0]).square().mean()
    assert loads == [0, 1, 2]
    loads.clear()
    loss.backward()
    assert loads == [0], "backward loaded again a slice that forward left in device memory"
    model.zero_grad(set_to_none=True)
    fresh = OffloadModel(make(), num_slices=3, backend=StreamedCpu(Timeline()))
    assert same(run(fresh), expected)
