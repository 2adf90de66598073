"""Which Accelerator calls offload makes, in which order, and how much is resident.

With :class:`RecordingBackend` every protocol call is observable. The copy path is
forced (as on an accelerator), so every load is a ``backend.stream(copy_stream)``
block and every wait of the compute stream goes through ``backend.current_stream()``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from accel.testing import RecordingBackend
from offload import OffloadModel, offload_parameters

pytestmark = pytest.mark.usefixtures("copies")


def make(count: int = 6) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(8, 8) for _ in range(count)])


def copy_stream_of(backend: RecordingBackend) -> Any:
    streams = [c.args[0] for c in backend.calls if c.name == "stream"]
    assert streams, backend.call_names()
    return streams[0]


@pytest.mark.parametrize("checkpoint_activation", [False, True], ids=["plain", "ckpt"])
def test_next_slice_is_loaded_before_the_current_one_computes(checkpoint_activation: bool) -> None:
    backend = RecordingBackend()
    model = OffloadModel(
        make(), num_slices=3, backend=backend, checkpoint_activation=checkpoint_activation
    )
    starts: list[tuple[int, tuple[int, ...]]] = []
    for first in (start for start, _ in model.slices):
        model.module[first].register_forward_pre_hook(
            lambda module, args: starts.append((len(backend.calls), model.resident_slices))
        )
    backend.clear()
    with torch.no_grad():
        model(torch.randn(4, 8))
    names = backend.call_names()
    copy = copy_stream_of(backend)
    loads = [i for i, c in enumerate(backend.calls) if c.name == "stream" and c.args[0] is copy]
    previous = 0
    for index, (position, resident) in enumerate(starts):
        # Slice `index` computes while slice `index + 1` is already on its way ...
        expected = {index, index + 1} if index + 1 < len(starts) else {index - 1, index}
        assert set(resident) == expected, (index, resident)
        # ... issued before the compute stream was told to wait for slice `index`.
        window = names[previous:position]
        waits = [i for i, name in enumerate(window) if name == "current_stream"]
        issued = [i for i, name in enumerate(window) if name == "stream"]
        assert waits, window
        if index + 1 < len(starts):
            assert issued and issued[-1] < waits[-1], window
        assert sum(1 for load in loads if load < position) >= min(index + 2, len(starts))
        previous = position
    assert model.max_resident_slices == 2


@pytest.mark.parametrize("checkpoint_activation", [False, True], ids=["plain", "ckpt"])
def test_backward_prefetches_the_previous_slice(checkpoint_activation: bool) -> None:
    backend = RecordingBackend()
    model = OffloadModel(
        make(8), num_slices=4, backend=backend, checkpoint_activation=checkpoint_activation
    )
    seen: list[tuple[int, tuple[int, ...]]] = []
    for index, (_, stop) in enumerate(model.slices):
        model.module[stop - 1].register_full_backward_hook(
            lambda module, gin, gout, index=index: seen.append((index, model.resident_slices))
        )
    for _ in range(3):
        model(torch.randn(4, 8)).sum().backward()
        assert model.max_resident_slices <= 2
    for index, resident in seen:
        assert index in resident and len(resident) <= 2
        if index > 0:
            assert index - 1 in resident, (index, resident)
    assert [index for index, _ in seen[:4]] == [3, 2, 1, 0]


def test_every_cross_stream_use_is_ordered() -> None:
    backend = RecordingBackend()
    model = OffloadModel(make(), num_slices=3, backend=backend, checkpoint_activation=True)
    model(torch.randn(4, 8)).sum().backward()
    backend.clear()
    model(torch.randn(4, 8)).sum().backward()
    names = backend.call_names()
    copy = copy_stream_of(backend)
    # Gradients and offloaded activations are read on the copy stream: their memory is
    # kept from reuse until that stream is done; restored activations and loaded
    # gradients are used on the compute stream.
    on_copy = [c for c in backend.calls if c.name == "record_stream" and c.args[1] is copy]
    on_compute = [c for c in backend.calls if c.name == "record_stream" and c.args[1] is not copy]
    assert len(on_copy) >= 12 + 3  # 12 weight and bias gradients, 3 slice inputs
    assert on_compute  # restored activations
    assert names.count("mark_step") >= 6  # after each slice's forward and backward
    assert "synchronize" not in names  # waits are on events, never the whole device


def test_pinned_memory_is_allocated_pinned_once() -> None:
    backend = RecordingBackend()
    model = OffloadModel(make(), num_slices=3, backend=backend, checkpoint_activation=True)
    allocations_at_wrap = backend.count("empty_pinned")
    # One block per dtype for every slice: torch's pinned allocator rounds each request
    # up to a power of two, so one flat per slice would pay the rounding once per slice.
    assert allocations_at_wrap == 1
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        if step == 0:
            first_step = backend.count("empty_pinned") - allocations_at_wrap
    # The first step allocates one gradient block (laid out like the parameters' block)
    # and the slices' saved inputs (3); later steps reuse them (gradients zeroed in place
    # stay the same tensors).
    assert first_step == 4
    assert backend.count("empty_pinned") == allocations_at_wrap + first_step
    # Page-locked memory is allocated as such, never pinned from a pageable copy.
    assert backend.count("pin_memory") == 0


def test_parameter_offload_orders_its_copies() -> None:
    backend = RecordingBackend()

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.c(self.b(self.a(x)) + x)

    net = Net()
    handle = offload_parameters(net, prefetch=1, backend=backend)
    for _ in range(2):
        backend.clear()
        net(torch.randn(2, 4)).sum().backward()
    names = backend.call_names()
    assert names.count("pin_memory") == 0  # parameters and gradients were pinned before
    assert backend.count("record_stream") >= 6  # device copies and gradient snapshots
    assert handle.max_resident <= 2
    handle.remove()
