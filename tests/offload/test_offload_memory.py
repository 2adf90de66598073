"""Memory does not grow over 200 training steps.

Three measures, each deterministic: the number of live tensors the garbage collector
can see (exactly the same after step 20 and after step 200), the wrappers' internal
bookkeeping (pools, pending gradients, prefetch queues, storage maps: bounded), and
Python allocations traced by ``tracemalloc`` (loosely: under 256 KiB of growth; torch's
own tensor memory is counted by the first measure).
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable

import pytest
import torch
from torch import nn

from checkpointing import checkpoint
from offload import Engine, OffloadModel, State, offload_parameters
from offload._params.swap import SwapData

STEPS = 200
WARMUP = 20


pytestmark = pytest.mark.usefixtures("copies")


def live_tensors() -> int:
    gc.collect()
    return sum(1 for obj in gc.get_objects() if issubclass(type(obj), torch.Tensor))


def train(step: Callable[[int], None]) -> tuple[int, int, int]:
    """Run STEPS steps; return live tensors after WARMUP and at the end, and traced growth."""
    for index in range(WARMUP):
        step(index)
    after_warmup = live_tensors()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for index in range(WARMUP, STEPS):
            step(index)
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return after_warmup, live_tensors(), after - before


class Counter(nn.Module):
    """Identity with a buffer updated in place every forward (as running statistics are)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("seen", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.add_(1)
        return x


def test_offload_model_memory_is_flat() -> None:
    torch.manual_seed(0)
    layers = nn.Sequential(*[nn.Linear(16, 16) for _ in range(6)], Counter())
    model = OffloadModel(layers, num_slices=3, checkpoint_activation=True, num_microbatches=2)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    engine = Engine(model, optimizer, gradient_accumulation_steps=2, loss_scale="dynamic")
    data = [torch.randn(8, 16, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    pool = model._strategy.config.pool

    def step(index: int) -> None:
        engine.backward(engine(data[index % 4]).square().mean())
        engine.step()

    first, last, traced = train(step)
    assert last == first, f"{last - first} tensors leaked over {STEPS - WARMUP} steps"
    assert traced < 256 * 1024, f"{traced} bytes of Python allocations kept"
    assert len(pool) <= 3  # one pinned buffer per slice input kept on the host, reused
    assert not model._strategy.residency._grads
    assert model.state is State.IDLE and model.is_home()


def test_parameter_offload_memory_is_flat() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(16, 16) for _ in range(4)])
            self.head = nn.Linear(16, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for index, block in enumerate(self.blocks):
                x = x + (checkpoint(block, x, use_reentrant=True) if index % 2 else block(x))
            return self.head(x)

    torch.manual_seed(0)
    model = Net()
    handle = offload_parameters(model, prefetch=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    data = [torch.randn(8, 16, generator=torch.Generator().manual_seed(i)) for i in range(4)]

    def step(index: int) -> None:
        model(data[index % 4]).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    first, last, traced = train(step)
    assert last == first, f"{last - first} tensors leaked over {STEPS - WARMUP} steps"
    assert traced < 256 * 1024, f"{traced} bytes of Python allocations kept"
    swap = handle.strategy
    assert isinstance(swap, SwapData)
    assert not swap._mover.storage_owner and not swap._mover.prefetched
    assert handle.resident_modules == () and handle.state is State.IDLE
    handle.remove()


def test_dropped_wrappers_are_collected() -> None:
    import weakref

    model = OffloadModel(
        nn.Sequential(*[nn.Linear(4, 4) for _ in range(4)]),
        num_slices=2,
        checkpoint_activation=True,
    )
    engine = Engine(model, torch.optim.SGD(model.parameters(), lr=0.1))
    engine.backward(engine(torch.randn(2, 4)).sum())
    engine.step()
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    handle = offload_parameters(net)
    net(torch.randn(2, 4)).sum().backward()
    refs = [weakref.ref(obj) for obj in (model, engine, net, handle)]
    del model, engine, net, handle
    gc.collect()
    assert [ref() for ref in refs] == [None] * 4
