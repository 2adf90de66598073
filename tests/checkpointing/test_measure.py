from __future__ import annotations

import torch
from torch import nn

from checkpointing import SavedTensorMeter


def test_counts_each_saved_storage_once_and_skips_excluded() -> None:
    layer = nn.Linear(256, 256, bias=False)
    x = torch.randn(64, 256, requires_grad=True)
    with SavedTensorMeter(exclude=layer.parameters()) as meter:
        hidden = layer(x)  # saves x (the weight is excluded)
        out = (hidden * hidden[:, :].view(64, 256)).sum()  # saves hidden once, via two views
    assert meter.bytes == x.nbytes + hidden.nbytes
    out.backward()


def test_stops_counting_after_exit_and_restarts_on_enter() -> None:
    x = torch.randn(32, requires_grad=True)
    meter = SavedTensorMeter()
    with meter:
        (x * x).sum()
    counted = meter.bytes
    assert counted == x.nbytes
    (x.exp()).sum()
    assert meter.bytes == counted
    with meter:
        pass
    assert meter.bytes == 0
