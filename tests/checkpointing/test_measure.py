from __future__ import annotations

import torch
from torch import nn

from checkpointing import SavedTensorMeter
from checkpointing._measure import graph_saved_bytes


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


def test_the_graph_walk_leaves_out_parameters_and_their_relaid_copies_only() -> None:
    # What inductor does to a convolution weight: a channels-last copy, saved for
    # backward. The walk counts it as activations unless told whose copies to skip.
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 8, 3, bias=False)
    x = torch.randn(2, 4, 6, 6, requires_grad=True)
    relaid = conv.weight.contiguous(memory_format=torch.channels_last)
    assert relaid.untyped_storage().data_ptr() != conv.weight.untyped_storage().data_ptr()
    out = nn.functional.conv2d(x, relaid)
    scaled = out * out  # saves out, twice over one storage
    everything = graph_saved_bytes(scaled, [conv.weight])
    assert everything == x.nbytes + relaid.nbytes + out.nbytes
    skipped = graph_saved_bytes(scaled, [conv.weight], copies_of=[conv.weight])
    assert skipped == x.nbytes + out.nbytes
    # A saved tensor of a parameter's shape with other values is no copy of it.
    other = nn.Parameter(torch.randn(8, 4, 3, 3))
    assert graph_saved_bytes(scaled, [conv.weight], copies_of=[other]) == everything
    scaled.sum().backward()
