"""Pinned host memory in one block per dtype, handed out as views.

torch's pinned host allocator rounds every request up to a power of two, so a flat per
slice of 512.08 MiB takes 1 GiB. These checks count the allocations through the
recording backend (which forces the device path's copies on CPU).
"""

from __future__ import annotations

import torch
from torch import nn

from accel.testing import RecordingBackend
from offload import OffloadModel, offload_parameters


class _ToDouble(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.double()


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(8, 8) for _ in range(5)]
    layers += [_ToDouble(), nn.Linear(8, 8).double()]  # a second dtype: a second block
    return nn.Sequential(*layers)


def _pointers(tensors: list[torch.Tensor]) -> dict[torch.dtype, set[int]]:
    found: dict[torch.dtype, set[int]] = {}
    for tensor in tensors:
        found.setdefault(tensor.dtype, set()).add(tensor.untyped_storage().data_ptr())
    return found


def test_slices_share_one_block_per_dtype_and_gradients_are_never_rewritten(
    copies: None,
) -> None:
    backend = RecordingBackend()
    model = OffloadModel(_model(), num_slices=4, backend=backend)
    assert backend.count("empty_pinned") == 2  # float32 and float64, for all 4 slices
    assert [len(p) for p in _pointers(list(model.parameters())).values()] == [1, 1]

    def step() -> dict[str, torch.Tensor]:
        backend.clear()
        model(torch.randn(4, 8)).sum().backward()
        return {name: p.grad for name, p in model.named_parameters() if p.grad is not None}

    first = step()
    assert len(first) == 12
    # One gradient block per dtype for the pass, not one per slice.
    assert backend.count("empty_pinned") == 2, backend.call_names()
    grad_pointers = {g.untyped_storage().data_ptr() for g in first.values()}
    assert len(grad_pointers) == 2
    kept = {name: grad.clone() for name, grad in first.items()}
    model.zero_grad(set_to_none=True)
    second = step()
    # Gradients handed out by the first pass were not written by the second.
    assert all(torch.equal(first[name], kept[name]) for name in first)
    assert all(
        second[name].untyped_storage().data_ptr() != first[name].untyped_storage().data_ptr()
        for name in first
    )


def test_offload_parameters_packs_every_unit_in_one_block(copies: None) -> None:
    backend = RecordingBackend()
    torch.manual_seed(0)
    net = nn.Sequential(*[nn.Linear(8, 8) for _ in range(4)])
    handle = offload_parameters(net, backend=backend)
    assert backend.count("empty_pinned") == 1
    assert len({p.untyped_storage().data_ptr() for p in net.parameters()}) == 1
    net(torch.randn(2, 8)).sum().backward()
    handle.remove()
