"""Backward writes gradients into fixed device memory: nothing parameter-sized is allocated.

Both wrappers, both strategies: a dispatch-level tracer (``_offload_allocations.py``)
records every tensor an operator creates on the device during the third step's backward
(the first two fill the wrappers' memory pools, and let ``offload_parameters`` learn the
order it prefetches in), and none may be as large as a weight (the activations are kept
far smaller).
Gradients and loss are compared with the plain model on the same device: bit for bit
with one micro-batch, within the offload tests' tolerance with four. The models have a
tied weight (used by two slices or two modules) and a frozen layer.

On the host the ``swap-data`` and ``copy-parameters`` strategies are both forced, copies
included (host memory handed out as gradients is page-locked memory, left out of the
count by ``HostMarkingCpu``). On a device each runs where the device allows it (openreg
refuses the ``.data`` swap), and there the tracer also counts the live device bytes
allocated during backward, the measure of a device without memory counters.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from _offload_allocations import Allocations, HostMarkingCpu
from torch import nn

from accel import Accelerator, _compat
from checkpointing import checkpoint
from offload import OffloadModel, offload_parameters
from offload._core import strategy, transfer

WIDTH = 64
ROWS = 2  # an activation (ROWS x WIDTH) is a small fraction of a weight (WIDTH x WIDTH)
STEPS = 3
MICRO_TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}


@pytest.fixture(params=[strategy.SWAP_DATA, strategy.COPY_PARAMETERS])
def backend(
    request: pytest.FixtureRequest, accel_backend: Accelerator, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Accelerator]:
    """The backend under test, offloading with the strategy in ``request.param``."""
    wanted = request.param
    if accel_backend.is_lazy:
        pytest.skip(
            f"{accel_backend.name} plans the memory of each graph itself: offload keeps no "
            "device memory for it, and a dispatch-level tracer sees no allocations"
        )
    if accel_backend.device_type == "cpu":
        accel_backend = HostMarkingCpu()
        monkeypatch.setattr(transfer, "copies_needed", lambda device, home: True)
    native = strategy.choose(accel_backend.device())
    if wanted == strategy.COPY_PARAMETERS and native != wanted:
        monkeypatch.setattr(strategy, "choose", lambda device, home=None: wanted)
    elif wanted != native:
        pytest.skip(f"{accel_backend.name} cannot point a host tensor's .data at its memory")
    yield accel_backend


def _layers() -> nn.Sequential:
    torch.manual_seed(0)
    layers = nn.Sequential(
        *[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU()) for _ in range(5)],
        nn.Linear(WIDTH, WIDTH),
    )
    layers[5].weight = layers[0][0].weight  # tied across slices
    layers[2].requires_grad_(False)  # frozen
    return layers


class _Tied(nn.Module):
    """Tied embedding and head, residual blocks (some checkpointed), a frozen block."""

    def __init__(self, checkpointed: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.checkpointed = checkpointed
        self.embed = nn.Embedding(40, WIDTH)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH))
            for _ in range(3)
        )
        self.blocks[1].requires_grad_(False)
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, 40, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(ids)
        for block in self.blocks:
            if self.checkpointed:
                hidden = hidden + checkpoint(block, hidden, use_reentrant=False)
            else:
                hidden = hidden + block(hidden)
        out: torch.Tensor = self.head(self.norm(hidden))
        return out


def _weight_bytes(model: nn.Module) -> int:
    """The smallest weight matrix's bytes: no allocation in backward may reach it."""
    return min(p.numel() * p.element_size() for p in model.parameters() if p.dim() == 2)


def _traced_backward(backend: Accelerator, loss: torch.Tensor) -> Allocations:
    with Allocations(backend.device_type) as tracer:
        loss.backward()
    backend.synchronize()
    return tracer


def _grads(model: nn.Module) -> list[torch.Tensor | None]:
    return [None if p.grad is None else p.grad.detach().cpu() for p in model.parameters()]


def _assert_equal_grads(
    got: list[torch.Tensor | None], expected: list[torch.Tensor | None], **tolerance: Any
) -> None:
    assert [g is None for g in got] == [g is None for g in expected]
    pairs = [(a, b) for a, b in zip(got, expected, strict=True) if a is not None]
    torch.testing.assert_close([a for a, _ in pairs], [b for _, b in pairs], **tolerance)


def _exact(backend: Accelerator) -> dict[str, float]:
    """Bit for bit where the device runs the host's kernels (cpu, openreg)."""
    return {"rtol": 0.0, "atol": 0.0} if backend.device_type in ("cpu", "openreg") else {}


def _check_backward(
    backend: Accelerator,
    model: nn.Module,
    plain: nn.Module,
    inputs: torch.Tensor,
    tolerance: dict[str, float],
    keep: bool = False,
    rounded: torch.Tensor | None = None,
) -> Allocations:
    """``STEPS`` steps of both models; trace the last backward of ``model``; compare.

    With ``keep`` the gradients accumulate from step to step (as under gradient
    accumulation), otherwise each step starts without them. The gradient of ``rounded``
    (a parameter of ``model``) is compared within the micro-batch tolerance.
    """
    device = backend.device()

    def loss(module: nn.Module) -> torch.Tensor:
        out: torch.Tensor = module(inputs.to(device))
        return out.square().mean()

    for step in range(STEPS):
        for module in (model, plain):
            if not keep:
                module.zero_grad(set_to_none=True)
        expected = loss(plain)
        expected.backward()
        got = loss(model)
        if step < STEPS - 1:
            got.backward()
            continue
        tracer = _traced_backward(backend, got)
        torch.testing.assert_close(got.detach().cpu(), expected.detach().cpu(), **tolerance)
        loose = [p is rounded for p in model.parameters()]
        pairs = list(zip(_grads(model), _grads(plain), loose, strict=True))
        for want, given in ((False, tolerance), (True, MICRO_TOLERANCE)):
            chosen = [(a, b) for a, b, rounding in pairs if rounding == want]
            _assert_equal_grads([a for a, _ in chosen], [b for _, b in chosen], **given)
    return tracer


def _assert_none_parameter_sized(tracer: Allocations, model: nn.Module) -> None:
    weight = _weight_bytes(model)
    assert tracer.at_least(weight) == [], (
        f"backward allocated {len(tracer.at_least(weight))} device tensors of a weight's "
        f"size ({weight} bytes) or more: {tracer.ops(weight)}"
    )
    if tracer.device_type != "cpu":  # device memory apart from host memory: count it live
        assert tracer.peak_live_bytes < weight, tracer.peak_live_bytes


@pytest.mark.parametrize("keep", [False, True], ids=["zeroed", "kept"])
@pytest.mark.parametrize("num_microbatches", [1, 4])
def test_offload_model_backward_allocates_nothing_parameter_sized(
    backend: Accelerator, num_microbatches: int, keep: bool
) -> None:
    layers = _layers()
    plain = copy.deepcopy(layers).to(backend.device())
    plain[5].weight = plain[0][0].weight
    model = OffloadModel(
        layers,
        num_slices=3,
        checkpoint_activation=True,
        num_microbatches=num_microbatches,
        backend=backend,
    )
    inputs = torch.randn(4 * ROWS if num_microbatches > 1 else ROWS, WIDTH)
    tolerance = _exact(backend) if num_microbatches == 1 else MICRO_TOLERANCE
    # A gradient kept from the last step is already in the tied weight's memory when its
    # two uses (two slices' backward passes) are added, one after the other; autograd
    # sums the two uses first: equal to rounding.
    tied = layers[0][0].weight if keep else None
    tracer = _check_backward(backend, model, plain, inputs, tolerance, keep, rounded=tied)
    _assert_none_parameter_sized(tracer, model)


@pytest.mark.parametrize("keep", [False, True], ids=["zeroed", "kept"])
@pytest.mark.parametrize("checkpointed", [False, True], ids=["plain", "checkpointed"])
def test_parameter_offload_backward_allocates_nothing_parameter_sized(
    backend: Accelerator, checkpointed: bool, keep: bool
) -> None:
    model = _Tied(checkpointed)
    plain = copy.deepcopy(model).to(backend.device())
    plain.head.weight = plain.embed.weight
    handle = offload_parameters(model, backend=backend)
    assert handle.strategy_name == strategy.choose(backend.device())
    ids = torch.randint(0, 40, (ROWS, 2), generator=torch.Generator().manual_seed(1))
    tracer = _check_backward(backend, model, plain, ids, _exact(backend), keep)
    _assert_none_parameter_sized(tracer, model)
    handle.remove()


def test_bfloat16_parameters_accumulate_in_place_in_their_dtype(backend: Accelerator) -> None:
    # Gradients accumulate in the parameter's dtype, as the plain model's do: bfloat16
    # products written into bfloat16 memory (the plain model's kernels, bit for bit).
    layers = _layers().to(torch.bfloat16)
    plain = copy.deepcopy(layers).to(backend.device())
    plain[5].weight = plain[0][0].weight
    model = OffloadModel(layers, num_slices=3, checkpoint_activation=True, backend=backend)
    inputs = torch.randn(ROWS, WIDTH, dtype=torch.bfloat16)
    tracer = _check_backward(backend, model, plain, inputs, _exact(backend))
    _assert_none_parameter_sized(tracer, model)
    assert {p.grad.dtype for p in model.parameters() if p.grad is not None} == {torch.bfloat16}


class _Matmul(nn.Module):
    """A layer computing with its weight through ``@``, not ``F.linear``."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(WIDTH, WIDTH) / WIDTH**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight


def test_a_layer_without_an_in_place_backward_shows_in_the_count(backend: Accelerator) -> None:
    # Only F.linear and F.embedding write in place. Any other layer's weight gradient
    # (here a matrix product; a convolution alike) is allocated by autograd and added
    # into the gradient memory, exactly, and the tracer sees that allocation: once per
    # such weight and backward, and nothing else.
    torch.manual_seed(0)
    layers = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), _Matmul(), nn.Linear(WIDTH, WIDTH))
    plain = copy.deepcopy(layers).to(backend.device())
    model = OffloadModel(layers, num_slices=3, checkpoint_activation=True, backend=backend)
    tracer = _check_backward(backend, model, plain, torch.randn(ROWS, WIDTH), _exact(backend))
    assert tracer.ops(_weight_bytes(model)) == ["aten.mm"]


def test_autograd_grad_gets_the_gradients_and_leaves_grad_alone(backend: Accelerator) -> None:
    # torch.autograd.grad wants the gradients themselves: nothing is written in place.
    model = _Tied(checkpointed=False)
    plain = copy.deepcopy(model).to(backend.device())
    plain.head.weight = plain.embed.weight
    handle = offload_parameters(model, backend=backend)
    ids = torch.randint(0, 40, (ROWS, 2), generator=torch.Generator().manual_seed(1))
    grads = []
    for module in (model, plain):
        hidden = module.embed(ids.to(backend.device()))
        loss = (module.head(module.norm(hidden)) ** 2).mean()
        grads.append([g.cpu() for g in torch.autograd.grad(loss, list(module.parameters())[:1])])
    torch.testing.assert_close(grads[0], grads[1], **_exact(backend))
    assert all(p.grad is None for p in model.parameters())
    assert handle.is_home()
    handle.remove()


def test_hooks_fire_where_a_release_skips_them_without_a_gradient(
    backend: Accelerator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Where AccumulateGrad runs no hook for an undefined gradient (torch releases before
    # the change probed by accel._compat), backward hands a swapped parameter zeros that
    # take no memory, added into the gradient in place: the hooks fire, nothing allocates.
    monkeypatch.setattr(_compat, "post_accumulate_hooks_run_without_gradient", lambda: False)
    model = _Tied(checkpointed=True)
    plain = copy.deepcopy(model).to(backend.device())
    plain.head.weight = plain.embed.weight
    handle = offload_parameters(model, backend=backend)
    fired: list[int] = []
    model.blocks[0][0].weight.register_post_accumulate_grad_hook(lambda p: fired.append(1))
    ids = torch.randint(0, 40, (ROWS, 2), generator=torch.Generator().manual_seed(1))
    tracer = _check_backward(backend, model, plain, ids, _exact(backend))
    _assert_none_parameter_sized(tracer, model)
    assert fired == [1] * STEPS
    handle.remove()
