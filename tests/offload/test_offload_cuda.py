"""On a real GPU: device memory stays within two slices, and streams do not race.

These run only on the ``cuda`` backend (elsewhere the accel plugin skips them with its
reason). A race between the copy stream and the compute stream would show up as a
difference between a normal run and one with ``CUDA_LAUNCH_BLOCKING=1`` (every kernel
and copy serialised), so the same training runs both ways in subprocesses and must
give bit-identical weights.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from accel import Accelerator
from offload import OffloadModel, State, offload_parameters

WIDTH = 1024
LAYERS = 16  # 4 MiB of float32 weights each
BATCH = 16


def warm_up_matmuls(backend: Accelerator) -> None:
    """Run a matmul forward and backward so that cuBLAS's workspaces exist before a baseline.

    cuBLAS allocates a workspace (32 MiB on Hopper) per handle and stream through the
    caching allocator on first use, and backward runs on autograd's device thread with
    a handle of its own; without this, a file run alone counts them in its peak.
    """
    a = torch.randn(64, 64, device=backend.device(), requires_grad=True)
    (a @ a).sum().backward()
    backend.synchronize()


def make_layers(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        *[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU()) for _ in range(LAYERS)]
    )


@pytest.mark.accel("cuda")
@pytest.mark.parametrize("checkpoint_activation", [False, True], ids=["plain", "ckpt"])
def test_peak_memory_is_two_slices_plus_activations(
    accel_backend: Accelerator, checkpoint_activation: bool
) -> None:
    warm_up_matmuls(accel_backend)
    base = accel_backend.memory_allocated()
    accel_backend.reset_peak_memory_stats()
    model = OffloadModel(
        make_layers(),
        num_slices=8,
        checkpoint_activation=checkpoint_activation,
        backend=accel_backend,
    )
    for _ in range(2):
        x = torch.randn(BATCH, WIDTH)
        model(x).sum().backward()
        model.zero_grad()
    accel_backend.synchronize()
    peak = accel_backend.max_memory_allocated() - base
    slice_bytes = max(model.slice_bytes)
    total = sum(model.slice_bytes)
    # Every layer keeps at most its input and its GELU input (fewer when checkpointed).
    activation = BATCH * WIDTH * 4
    activations = LAYERS * 2 * activation
    # Backward's transients: up to three activation gradients (the layer's output, GELU's
    # input, the layer's input), and at most one weight-sized tensor: the scratch a
    # gradient accumulating into the slice's buffer goes through (weight gradients are
    # written into the buffer, not allocated: see test_offload_allocations.py).
    layer_bytes = max(
        sum(p.numel() * p.element_size() for p in m.parameters())
        for m in model.modules()
        if isinstance(m, nn.Linear)
    )
    transients = layer_bytes + 3 * activation
    # Two slices of parameters (the double buffer), two of gradients (one slice's being
    # computed while the previous slice's are still being copied out), the activations,
    # the transients and 1 MiB for the input, the output, the loss and the allocator's
    # rounding.
    allowance = 2 * slice_bytes + 2 * slice_bytes + activations + transients + (1 << 20)
    assert peak <= allowance, (peak, allowance)
    assert allowance < 0.75 * total  # the bound is a real saving
    assert model.max_resident_slices == 2
    assert model.state is State.IDLE and model.is_home()


@pytest.mark.accel("cuda")
def test_warm_up_puts_cublas_workspaces_in_the_baseline(accel_backend: Accelerator) -> None:
    # What the memory tests rely on: after the warm-up, more matmuls (forward and
    # backward, other shapes) allocate nothing that stays.
    warm_up_matmuls(accel_backend)
    base = accel_backend.memory_allocated()
    b = torch.randn(256, 512, device=accel_backend.device(), requires_grad=True)
    (b @ b.T).sum().backward()
    del b
    accel_backend.synchronize()
    assert accel_backend.memory_allocated() == base


@pytest.mark.accel("cuda")
def test_parity_with_plain_model_on_the_device(accel_backend: Accelerator) -> None:
    device = accel_backend.device()
    plain = make_layers().to(device)
    model = OffloadModel(
        make_layers(),
        num_slices=3,
        checkpoint_activation=True,
        num_microbatches=2,
        backend=accel_backend,
    )
    x = torch.randn(BATCH, WIDTH, device=device)
    plain(x).square().mean().backward()
    out = model(x)
    out.square().mean().backward()
    torch.testing.assert_close(out, plain(x))
    for mine, theirs in zip(model.parameters(), plain.parameters(), strict=True):
        assert mine.device.type == "cpu" and mine.grad is not None and mine.grad.is_pinned()
        assert theirs.grad is not None
        torch.testing.assert_close(mine.grad, theirs.grad.cpu(), rtol=1e-4, atol=1e-5)


@pytest.mark.accel("cuda")
def test_parameter_offload_peak_memory(accel_backend: Accelerator) -> None:
    warm_up_matmuls(accel_backend)
    model = make_layers()
    handle = offload_parameters(model, prefetch=1, backend=accel_backend)
    x = torch.randn(BATCH, WIDTH, device=accel_backend.device())
    model(x).sum().backward()
    accel_backend.synchronize()
    accel_backend.reset_peak_memory_stats()
    base = accel_backend.memory_allocated()
    model(x).sum().backward()
    accel_backend.synchronize()
    layer_bytes = (WIDTH * WIDTH + WIDTH) * 4
    peak = accel_backend.max_memory_allocated() - base
    assert peak <= 6 * layer_bytes + 2 * LAYERS * BATCH * WIDTH * 4 + (4 << 20)
    assert handle.is_home()
    handle.remove()


_SCRIPT = """
import sys, torch
from torch import nn
import accel
from offload import OffloadModel

torch.use_deterministic_algorithms(True)
backend = accel.get_backend("cuda")
torch.manual_seed(0)
layers = nn.Sequential(*[nn.Sequential(nn.Linear(512, 512), nn.Dropout(0.1), nn.GELU())
                         for _ in range(6)])
model = OffloadModel(layers, num_slices=3, checkpoint_activation=True, num_microbatches=3,
                     backend=backend)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(3):
    x = torch.randn(10, 512)
    model(x).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()
torch.save([p.detach().clone() for p in model.parameters()], sys.argv[1])
"""


@pytest.mark.accel("cuda")
def test_results_do_not_depend_on_launch_blocking(
    accel_backend: Accelerator, tmp_path: Path
) -> None:
    del accel_backend  # the subprocesses select cuda themselves
    root = Path(__file__).resolve().parents[2]
    results = []
    for blocking in ("0", "1"):
        output = tmp_path / f"weights-{blocking}.pt"
        env = {
            **os.environ,
            "CUDA_LAUNCH_BLOCKING": blocking,
            "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
            "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
        }
        subprocess.run(
            [sys.executable, "-c", textwrap.dedent(_SCRIPT), str(output)],
            check=True,
            env=env,
            cwd=root,
            timeout=300,
        )
        results.append(torch.load(output))
    for normal, blocking in zip(*results, strict=True):
        assert torch.equal(normal, blocking)
