"""OffloadModel gives the plain model's outputs, gradients and weights, for every option.

Every comparison is bit-exact (``torch.equal``) where the arithmetic is the same:
the slices run the same kernels on the same values, and gradient accumulation happens
in the same order. Micro-batching is the one exception, and only for what it changes:
a weight gradient becomes the sum of per-micro-batch gradients instead of one
reduction over the whole batch, so gradients (and the weights after the optimizer
used them) are compared with ``rtol=1e-5, atol=1e-6`` there. Outputs stay exact.

Each test runs twice on the host: once as in production when device and offload device
are the same (``zero-copy``: nothing moves), and once with every copy made (``copy``:
packed pinned storage, double buffers, gradient and activation copies), which is the
code path accelerators take.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import accel
import offload
from accel.testing import RecordingBackend
from offload import (
    OffloadConfigError,
    OffloadError,
    OffloadModel,
    State,
    UnsupportedModelError,
)
from offload._model.slicing import partition

GRAD_TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}


def make_layers(seed: int = 0, dropout: float = 0.0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(6, 16),
        nn.ReLU(),
        nn.Linear(16, 16),
        nn.Dropout(dropout),
        nn.Tanh(),
        nn.Linear(16, 12),
        nn.GELU(),
        nn.Linear(12, 3),
    )


def assert_tensors(actual: list[torch.Tensor], expected: list[torch.Tensor], exact: bool) -> None:
    assert len(actual) == len(expected)
    for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert a.device == e.device and a.dtype == e.dtype and a.shape == e.shape, index
        if exact:
            assert torch.equal(a, e), f"tensor {index} differs: {(a - e).abs().max()}"
        else:
            torch.testing.assert_close(a, e, **GRAD_TOLERANCE)


def grads(model: nn.Module) -> list[torch.Tensor]:
    result = []
    for p in model.parameters():
        assert p.grad is not None
        result.append(p.grad)
    return result


def train(
    model: nn.Module,
    batches: list[torch.Tensor],
    make_optimizer: Callable[[Any], torch.optim.Optimizer],
    seed: int = 7,
) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    """Run a few steps; return the outputs and the gradients of each step."""
    optimizer = make_optimizer(model.parameters())
    outputs, all_grads = [], []
    torch.manual_seed(seed)
    for x in batches:
        out = model(x)
        (out.square().mean() + out.sum()).backward()
        outputs.append(out.detach().clone())
        all_grads.append([g.clone() for g in grads(model)])
        optimizer.step()
        optimizer.zero_grad()
    return outputs, all_grads


OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=0.01),
}


# Splitting -------------------------------------------------------------------------------


def test_partition_minimises_the_largest_slice() -> None:
    rng = torch.Generator().manual_seed(0)
    for _ in range(200):
        count = int(torch.randint(1, 9, (1,), generator=rng))
        sizes = torch.randint(0, 50, (count,), generator=rng).tolist()
        parts = int(torch.randint(1, count + 1, (1,), generator=rng))
        runs = partition(sizes, parts)
        assert len(runs) == parts and all(len(run) > 0 for run in runs)
        assert [i for run in runs for i in run] == list(range(count))
        best = min(
            max(sum(sizes[a:b]) for a, b in itertools.pairwise((0, *cuts, count)))
            for cuts in itertools.combinations(range(1, count), parts - 1)
        )
        assert max(sum(sizes[i] for i in run) for run in runs) == best


def test_slices_are_balanced_by_parameter_bytes() -> None:
    layers = [nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8), nn.Linear(8, 8), nn.Linear(64, 64)]
    layers[4] = nn.Linear(8, 64)
    model = OffloadModel(layers, num_slices=3)
    assert model.slices == ((0, 2), (2, 4), (4, 5))
    assert model.slice_bytes == (64 * 65 * 4, (64 * 8 + 8 + 8 * 8 + 8) * 4, (8 * 64 + 64) * 4)


# Parity ----------------------------------------------------------------------------------


@pytest.mark.parametrize("checkpoint_activation", [False, True], ids=["plain", "ckpt"])
@pytest.mark.parametrize("num_microbatches", [1, 3], ids=["mb1", "mb3"])
@pytest.mark.parametrize("num_slices", [1, 2, 3, 8])
def test_parity_with_plain_model(
    copy_mode: bool, num_slices: int, num_microbatches: int, checkpoint_activation: bool
) -> None:
    # Batch 10 in 3 micro-batches: 4 + 3 + 3 rows (unequal last chunks).
    batches = [torch.randn(10, 6, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    optimizer = "adam" if num_slices % 2 else "sgd"
    expected = train(make_layers(), batches, OPTIMIZERS[optimizer])
    model = OffloadModel(
        make_layers(),
        num_slices=num_slices,
        checkpoint_activation=checkpoint_activation,
        num_microbatches=num_microbatches,
    )
    actual = train(model, batches, OPTIMIZERS[optimizer])
    # Micro-batches run the same layers on fewer rows: a GEMM over 4 or 3 rows may round
    # differently from one over 10 (AVX-512 kernels block by row count), so only the
    # unsplit runs are compared bit for bit.
    exact = num_microbatches == 1
    assert_tensors(actual[0], expected[0], exact)
    for step_grads, step_expected in zip(actual[1], expected[1], strict=True):
        assert_tensors(step_grads, step_expected, exact)
    reference = make_layers()
    train(reference, batches, OPTIMIZERS[optimizer])
    assert_tensors(list(model.parameters()), list(reference.parameters()), exact)
    assert model.state is State.IDLE and model.is_home()
    assert model.max_resident_slices == min(2, num_slices)


@pytest.mark.parametrize("checkpoint_activation", [False, True], ids=["plain", "ckpt"])
def test_dropout_is_replayed_exactly(copy_mode: bool, checkpoint_activation: bool) -> None:
    batches = [torch.randn(10, 6, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    expected = train(make_layers(dropout=0.5), batches, OPTIMIZERS["sgd"])
    model = OffloadModel(
        make_layers(dropout=0.5), num_slices=3, checkpoint_activation=checkpoint_activation
    )
    actual = train(model, batches, OPTIMIZERS["sgd"])
    assert_tensors(actual[0], expected[0], exact=True)
    for step_grads, step_expected in zip(actual[1], expected[1], strict=True):
        assert_tensors(step_grads, step_expected, exact=True)


def test_dropout_with_microbatches_recomputes_the_same_masks(copy_mode: bool) -> None:
    # Micro-batches draw their dropout masks one after the other; the recomputation in
    # backward must replay exactly those, so checkpointing changes nothing at all.
    batches = [torch.randn(11, 6, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    runs = []
    for checkpoint_activation in (False, True):
        model = OffloadModel(
            make_layers(dropout=0.5),
            num_slices=4,
            checkpoint_activation=checkpoint_activation,
            num_microbatches=3,
        )
        runs.append((train(model, batches, OPTIMIZERS["adam"]), list(model.parameters())))
    (plain_run, plain_params), (ckpt_run, ckpt_params) = runs
    assert_tensors(ckpt_run[0], plain_run[0], exact=True)
    for a, b in zip(ckpt_run[1], plain_run[1], strict=True):
        assert_tensors(a, b, exact=True)
    assert_tensors(ckpt_params, plain_params, exact=True)


class Split(nn.Module):
    """Returns several tensors and non-tensor values; takes a keyword mask."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(6, 8)

    def forward(self, x: torch.Tensor, *, mask: torch.Tensor, gain: float) -> Any:
        h = self.proj(x) * mask
        lengths = (x > 0).sum(dim=1)  # an integer tensor crossing boundaries
        return h, x.tanh(), lengths, "tag", gain


class Mix(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(6, 8)

    def forward(
        self,
        h: torch.Tensor,
        side: torch.Tensor,
        lengths: torch.Tensor,
        tag: str,
        scale: float,
        *,
        mask: torch.Tensor,
        gain: float,
    ) -> Any:
        assert tag == "tag" and scale == 0.5 == gain
        out = torch.relu(self.a(h) + self.b(side)) * mask + lengths.unsqueeze(1) * scale
        return out, side, lengths, tag, scale


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.out = nn.Linear(8, 2)

    def forward(
        self,
        h: torch.Tensor,
        side: torch.Tensor,
        lengths: torch.Tensor,
        tag: str,
        scale: float,
        *,
        mask: torch.Tensor,
        gain: float,
    ) -> Any:
        return self.out(h) + side[:, :2] * gain, lengths


def multi_value_layers(seed: int = 3) -> list[nn.Module]:
    torch.manual_seed(seed)
    return [Split(), Mix(), Mix(), Head()]


def run_plain_layers(layers: list[nn.Module], *args: Any, **kwargs: Any) -> Any:
    out: Any = args
    for layer in layers:
        out = layer(*out, **kwargs)
        out = out if isinstance(out, tuple) else (out,)
    return out


@pytest.mark.parametrize("checkpoint_activation", [False, True], ids=["plain", "ckpt"])
@pytest.mark.parametrize("num_microbatches", [1, 3], ids=["mb1", "mb3"])
def test_several_values_and_keywords_cross_boundaries(
    copy_mode: bool, checkpoint_activation: bool, num_microbatches: int
) -> None:
    x = torch.randn(7, 6)
    mask = (torch.rand(7, 1, generator=torch.Generator().manual_seed(1)) > 0.3).float()
    x_plain = x.clone().requires_grad_()
    plain_layers = multi_value_layers()
    out, lengths = run_plain_layers(plain_layers, x_plain, mask=mask, gain=0.5)
    out.sum().backward()

    x_off = x.clone().requires_grad_()
    model = OffloadModel(
        multi_value_layers(),
        num_slices=4,
        checkpoint_activation=checkpoint_activation,
        num_microbatches=num_microbatches,
        batched_kwargs=("mask",),  # one row per sample: split with the batch
    )
    out_off, lengths_off = model(x_off, mask=mask, gain=0.5)
    out_off.sum().backward()
    exact = num_microbatches == 1
    assert torch.equal(out_off, out) and torch.equal(lengths_off, lengths)
    assert lengths_off.dtype == torch.int64 and not lengths_off.requires_grad
    assert x_off.grad is not None and x_plain.grad is not None
    assert_tensors([x_off.grad], [x_plain.grad], exact)
    plain_grads = [p.grad for layer in plain_layers for p in layer.parameters()]
    assert_tensors(grads(model), [g for g in plain_grads if g is not None], exact)


@pytest.mark.parametrize("checkpoint_activation", [False, True], ids=["plain", "ckpt"])
def test_batch_norm_running_statistics(copy_mode: bool, checkpoint_activation: bool) -> None:
    # Without micro-batches batch norm sees the whole batch, so everything is exact,
    # running statistics included (the recomputation must not update them again).
    def make() -> nn.Sequential:
        torch.manual_seed(4)
        return nn.Sequential(
            nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 8), nn.BatchNorm1d(8)
        )

    batches = [torch.randn(9, 6, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    plain = make()
    expected = train(plain, batches, OPTIMIZERS["sgd"])
    model = OffloadModel(make(), num_slices=3, checkpoint_activation=checkpoint_activation)
    actual = train(model, batches, OPTIMIZERS["sgd"])
    assert_tensors(actual[0], expected[0], exact=True)
    assert_tensors(list(model.buffers()), list(plain.buffers()), exact=True)
    model.eval()
    plain.eval()
    with torch.no_grad():
        assert torch.equal(model(batches[0]), plain(batches[0]))


def test_gradient_accumulation_across_backward_calls(copy_mode: bool) -> None:
    batches = [torch.randn(5, 6, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    plain, model = make_layers(), OffloadModel(make_layers(), num_slices=3)
    for module in (plain, model):
        for x in batches:
            module(x).pow(3).sum().backward()
    assert_tensors(grads(model), grads(plain), exact=True)


def test_no_grad_forward_builds_no_graph(copy_mode: bool) -> None:
    model = OffloadModel(make_layers(), num_slices=3, checkpoint_activation=True)
    x = torch.randn(4, 6)
    with torch.no_grad():
        out = model(x)
    assert not out.requires_grad and out.grad_fn is None
    assert torch.equal(out, make_layers()(x))
    assert model.state is State.IDLE and model.is_home()


def test_frozen_and_input_gradients(copy_mode: bool) -> None:
    plain, model = make_layers(), OffloadModel(make_layers(), num_slices=4)
    for module in (plain, model):
        for p in list(module.parameters())[:4]:
            p.requires_grad_(False)
    x_plain = torch.randn(3, 6, requires_grad=True)
    x_off = x_plain.detach().clone().requires_grad_()
    plain(x_plain).sum().backward()
    model(x_off).sum().backward()
    assert x_off.grad is not None and x_plain.grad is not None
    assert torch.equal(x_off.grad, x_plain.grad)
    for p_off, p_plain in zip(model.parameters(), plain.parameters(), strict=True):
        assert (p_off.grad is None) == (p_plain.grad is None)
        if p_plain.grad is not None:
            assert torch.equal(p_off.grad, p_plain.grad)


def test_state_dict_and_load(copy_mode: bool) -> None:
    model = OffloadModel(make_layers(), num_slices=2)
    plain = make_layers(seed=9)
    model.module.load_state_dict(plain.state_dict())
    x = torch.randn(2, 6)
    assert torch.equal(model(x), plain(x))


def test_checkpoints_move_between_wrapped_and_plain(copy_mode: bool) -> None:
    model = OffloadModel(make_layers(seed=4), num_slices=3)
    saved = model.state_dict()
    assert list(saved) == list(make_layers().state_dict())  # no "module." prefix
    plain = make_layers(seed=9)
    plain.load_state_dict(saved)  # strict: every key matches
    x = torch.randn(2, 6)
    assert torch.equal(plain(x), model(x))
    other = OffloadModel(make_layers(seed=5), num_slices=2)
    other.load_state_dict(make_layers(seed=4).state_dict())  # a plain checkpoint
    assert torch.equal(other(x), model(x))
    prefixed = {f"module.{key}": value for key, value in make_layers(seed=6).state_dict().items()}
    other.load_state_dict(prefixed)  # checkpoints saved with the prefix still load
    assert torch.equal(other(x), make_layers(seed=6)(x))


# Errors ----------------------------------------------------------------------------------


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) + x


def test_a_model_that_is_not_sequential_is_refused_with_a_way_out() -> None:
    with pytest.raises(UnsupportedModelError, match=r"^offload: .*offload_parameters"):
        OffloadModel(Branchy())  # type: ignore[arg-type]
    with pytest.raises(UnsupportedModelError, match=r"not all nn\.Module"):
        OffloadModel([nn.Linear(2, 2), "relu"])  # type: ignore[list-item]
    with pytest.raises(UnsupportedModelError, match=r"^offload: .*empty Sequential.*pass the"):
        OffloadModel(nn.Sequential())
    assert issubclass(UnsupportedModelError, TypeError)


def test_bad_slice_and_microbatch_counts() -> None:
    with pytest.raises(OffloadConfigError, match="num_slices=9 is more than the model's 8 layers"):
        OffloadModel(make_layers(), num_slices=9)
    with pytest.raises(OffloadConfigError, match="num_slices must be a positive int"):
        OffloadModel(make_layers(), num_slices=0)
    with pytest.raises(OffloadConfigError, match="num_microbatches must be a positive int"):
        OffloadModel(make_layers(), num_microbatches=True)  # type: ignore[arg-type]


class UnavailableBackend(RecordingBackend):
    def is_available(self) -> bool:
        return False


def test_devices_that_are_not_available() -> None:
    with pytest.raises(OffloadConfigError, match="'meta' is not available to backend 'cpu'"):
        OffloadModel(make_layers(), device="meta")
    with pytest.raises(OffloadConfigError, match="'cpu:3' is not available: cpu: device index 3"):
        OffloadModel(make_layers(), device="cpu:3")
    with pytest.raises(OffloadConfigError, match="backend 'recording' is not available"):
        OffloadModel(make_layers(), backend=UnavailableBackend())
    with pytest.raises(OffloadConfigError, match="offload_device must be host memory"):
        OffloadModel(make_layers(), offload_device="meta")
    assert OffloadModel(make_layers(), backend="recording").backend.name == "recording"
    with pytest.raises(
        accel.BackendNotFoundError, match=r"^offload: backend='nope' cannot be used"
    ):
        OffloadModel(make_layers(), backend="nope")
    with pytest.raises(accel.AccelTypeError, match=r"^offload: backend must be an accel backend"):
        OffloadModel(make_layers(), backend=3)  # type: ignore[arg-type]
    assert issubclass(OffloadConfigError, ValueError) and issubclass(OffloadError, RuntimeError)


def test_conversions_of_the_wrapper_are_refused() -> None:
    model = OffloadModel(make_layers(), num_slices=2)
    with pytest.raises(OffloadError, match="convert the model before wrapping it"):
        model.double()


def test_autograd_grad_and_second_backward_are_refused(copy_mode: bool) -> None:
    model = OffloadModel(make_layers(), num_slices=2)
    x = torch.randn(3, 6, requires_grad=True)
    loss = model(x).sum()
    with pytest.raises(RuntimeError, match=r"not with torch\.autograd\.grad"):
        torch.autograd.grad(loss, x)
    assert model.state is State.IDLE
    loss = model(torch.randn(3, 6)).sum()
    loss.backward(retain_graph=True)
    with pytest.raises(OffloadError, match="second time"):
        loss.backward()
    assert model.state is State.IDLE and model.is_home()


def test_microbatch_outputs_without_batch_dimension_are_refused() -> None:
    class Summary(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.sum()

    model = OffloadModel([nn.Linear(2, 2), Summary()], num_slices=2, num_microbatches=2)
    with pytest.raises(OffloadError, match=r"returned tensor 0 with shapes \[\(\), \(\)\]"):
        model(torch.randn(4, 2))
    assert model.state is State.IDLE and model.is_home()


def test_tensors_hidden_in_containers_are_refused() -> None:
    class Listy(nn.Module):
        def forward(self, x: torch.Tensor) -> Any:
            return [x, x]

    model = OffloadModel([Listy(), nn.Identity()], num_slices=2)
    with pytest.raises(OffloadError, match="is a list that contains tensors"):
        model(torch.randn(2, 2))


def test_public_api_is_documented() -> None:
    assert offload.__all__ == sorted(offload.__all__)
    for name in offload.__all__:
        assert getattr(offload, name).__doc__, name


@pytest.mark.parametrize("checkpoint_activation", [False, True], ids=["plain", "ckpt"])
def test_autocast_is_replayed(copy_mode: bool, checkpoint_activation: bool) -> None:
    x = torch.randn(6, 6)
    plain = make_layers(dropout=0.3)
    model = OffloadModel(
        make_layers(dropout=0.3), num_slices=3, checkpoint_activation=checkpoint_activation
    )
    results = []
    for module in (plain, model):
        torch.manual_seed(2)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = module(x)
        assert out.dtype == torch.bfloat16
        out.float().square().sum().backward()
        results.append((out, grads(module)))
    (expected, expected_grads), (actual, actual_grads) = results
    assert torch.equal(actual, expected)
    assert_tensors(actual_grads, expected_grads, exact=True)


def test_a_batch_smaller_than_the_microbatch_count_is_refused() -> None:
    model = OffloadModel(make_layers(), num_slices=2, num_microbatches=5)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(OffloadConfigError, match=r"num_microbatches=5 .* the batch has 2 rows"):
        model(torch.randn(2, 6))
    assert model.state is State.IDLE
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before, strict=True))
    model(torch.randn(5, 6)).sum().backward()  # still usable with a batch of 5 rows
