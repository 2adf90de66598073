"""Checkpointed runs give the plain run's outputs, gradients, buffers and generator states.

Every comparison is bit-exact (``torch.equal``) on the host (and on PyTorch's reference
PrivateUse1 device, whose kernels are the host's), where the recomputation runs the same
kernels on the same inputs with the same generator state. On other
devices some backward kernels accumulate with atomics, so there the comparison uses
``torch.testing.assert_close`` with its default (dtype-aware) tolerances.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from accel import Accelerator
from checkpointing import (
    CheckpointWrapper,
    apply_activation_checkpointing,
    checkpoint,
    checkpoint_sequential,
    checkpoint_wrapper,
)

# Backend-generic tests put tensors on the backend's device.
pytestmark = pytest.mark.accel_requires("tensors")

# Devices whose kernels are the host's, so a recomputation is bit-identical: the CPU, and
# PyTorch's reference PrivateUse1 device (its operators run on the CPU underneath).
HOST_KERNEL_DEVICES = ("cpu", "openreg")
MODES = [pytest.param(True, id="reentrant"), pytest.param(False, id="non_reentrant")]
SEED = 1234


# Helpers ---------------------------------------------------------------------------------


def assert_same(actual: Any, expected: Any, backend: Accelerator, what: str = "value") -> None:
    """Compare nested tuples/lists/dicts of tensors and plain values."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{what}: {type(actual).__name__}, not a tensor"
        assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
        if backend.device_type in HOST_KERNEL_DEVICES:
            assert torch.equal(actual, expected), f"{what}: tensors differ"
        else:
            torch.testing.assert_close(actual, expected, msg=f"{what}: tensors differ")
    elif isinstance(expected, (tuple, list)):
        assert isinstance(actual, (tuple, list)) and len(actual) == len(expected), what
        for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, backend, f"{what}[{index}]")
    elif isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), what
        for key in expected:
            assert_same(actual[key], expected[key], backend, f"{what}[{key!r}]")
    else:
        assert actual == expected, f"{what}: {actual!r} != {expected!r}"


def _detach(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_detach(v) for v in value)
    if isinstance(value, dict):
        return {k: _detach(v) for k, v in value.items()}
    return value


def _loss(outputs: Any) -> torch.Tensor:
    """Sum of squares of every float output that requires grad (weighted to vary grads)."""
    if isinstance(outputs, torch.Tensor):
        outputs = (outputs,)
    terms = [
        (out.float() ** 2).sum() * (index + 1)
        for index, out in enumerate(outputs)
        if isinstance(out, torch.Tensor) and out.requires_grad
    ]
    return torch.stack(terms).sum()


def train_step(
    backend: Accelerator,
    model: nn.Module,
    make_inputs: Callable[[], tuple[Any, ...]],
    forward: Callable[..., Any],
    *,
    backward: Callable[[Any, tuple[Any, ...], nn.Module], None] | None = None,
) -> dict[str, Any]:
    """Seed, run ``forward(model, *inputs)`` and backward; return everything observable."""
    inputs = make_inputs()
    torch.manual_seed(SEED)
    backend.manual_seed(SEED)
    outputs = forward(model, *inputs)
    if backward is None:
        _loss(outputs).backward()
    else:
        backward(outputs, inputs, model)
    observed = {
        "outputs": _detach(outputs),
        "input_grads": [
            None if t.grad is None else t.grad.clone()
            for t in inputs
            if isinstance(t, torch.Tensor) and t.is_floating_point()
        ],
        "param_grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        "params": [p.detach().clone() for p in model.parameters()],
        "buffers": [b.clone() for b in model.buffers()],
        "cpu_rng": torch.get_rng_state(),
        "device_rng": backend.get_rng_state(),
    }
    # Compared on the host: on a lazy device each comparison would otherwise be a graph
    # of its own to compile (dozens per test); the step runs as one graph here.
    backend.mark_step()
    host: dict[str, Any] = torch.utils._pytree.tree_map(
        lambda v: v.cpu() if isinstance(v, torch.Tensor) else v, observed
    )
    return host


def compare(
    backend: Accelerator,
    model: nn.Module,
    make_inputs: Callable[[], tuple[Any, ...]],
    plain: Callable[..., Any],
    checkpointed: Callable[..., Any],
    *,
    wrap: Callable[[nn.Module], nn.Module] | None = None,
    backward: Callable[[Any, tuple[Any, ...], nn.Module], None] | None = None,
) -> dict[str, Any]:
    """Run the plain and the checkpointed step on copies of ``model``; assert they agree."""
    model = model.to(backend.device())
    expected = train_step(backend, copy.deepcopy(model), make_inputs, plain, backward=backward)
    candidate = copy.deepcopy(model)
    if wrap is not None:
        candidate = wrap(candidate)
    actual = train_step(backend, candidate, make_inputs, checkpointed, backward=backward)
    for key in expected:
        assert_same(actual[key], expected[key], backend, key)
    return actual


def inputs_factory(
    backend: Accelerator, *shapes: tuple[int, ...], requires_grad: bool = True
) -> Callable[[], tuple[torch.Tensor, ...]]:
    generator = torch.Generator().manual_seed(7)
    values = [torch.randn(*shape, generator=generator) for shape in shapes]

    def make() -> tuple[torch.Tensor, ...]:
        device = backend.device()
        return tuple(v.to(device, copy=True).requires_grad_(requires_grad) for v in values)

    return make


class Block(nn.Module):
    """A residual MLP block with dropout and a layer norm."""

    def __init__(self, width: int = 16, p: float = 0.3) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, 2 * width)
        self.drop = nn.Dropout(p)
        self.fc2 = nn.Linear(2 * width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.fc2(self.drop(nn.functional.gelu(self.fc1(x)))))


def _model(factory: Callable[[], nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    return factory().train()


# Dropout, autocast ------------------------------------------------------------------------


@pytest.mark.parametrize("reentrant", MODES)
def test_dropout_is_replayed(accel_backend: Accelerator, reentrant: bool) -> None:
    model = _model(Block)
    compare(
        accel_backend,
        model,
        inputs_factory(accel_backend, (8, 16)),
        lambda m, x: m(x),
        lambda m, x: checkpoint(m, x, use_reentrant=reentrant),
    )


@pytest.mark.parametrize("reentrant", MODES)
def test_dropout_differs_without_rng_replay(accel_backend: Accelerator, reentrant: bool) -> None:
    # The counter-test: without preserve_rng_state, the recomputed mask is new, so the
    # gradients differ. This shows the parity tests above can fail.
    model = _model(lambda: Block(p=0.5)).to(accel_backend.device())
    make = inputs_factory(accel_backend, (8, 16))
    expected = train_step(accel_backend, copy.deepcopy(model), make, lambda m, x: m(x))
    actual = train_step(
        accel_backend,
        copy.deepcopy(model),
        make,
        lambda m, x: checkpoint(m, x, use_reentrant=reentrant, preserve_rng_state=False),
    )
    assert torch.equal(actual["outputs"], expected["outputs"])
    assert not torch.equal(actual["input_grads"][0], expected["input_grads"][0])


@pytest.mark.parametrize("reentrant", MODES)
def test_autocast_bfloat16(accel_backend: Accelerator, reentrant: bool) -> None:
    if not accel_backend.is_bf16_supported():
        pytest.skip("bfloat16 is not supported on this backend.")
    device_type = accel_backend.device_type

    def plain(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type, dtype=torch.bfloat16):
            return m(x)

    def checkpointed(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type, dtype=torch.bfloat16):
            return checkpoint(m, x, use_reentrant=reentrant)

    actual = compare(
        accel_backend, _model(Block), inputs_factory(accel_backend, (8, 16)), plain, checkpointed
    )
    # The recomputed forward ran in bfloat16 too: its matmul output had that dtype.
    assert actual["outputs"].dtype == torch.float32  # layer norm autocasts to float32


@pytest.mark.parametrize("reentrant", MODES)
def test_autocast_dtype_is_replayed_in_recomputation(
    accel_backend: Accelerator, reentrant: bool
) -> None:
    if not accel_backend.is_bf16_supported():
        pytest.skip("bfloat16 is not supported on this backend.")
    # A plain matmul (mm): the one operator every device's autocast lowers (PyTorch's
    # reference PrivateUse1 device lowers only mm, not linear's addmm).
    weight = torch.randn(8, 8, device=accel_backend.device(), requires_grad=True)
    seen: list[torch.dtype] = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        out = x @ weight
        seen.append(out.dtype)
        return out

    x = torch.randn(4, 8, device=accel_backend.device(), requires_grad=True)
    with torch.autocast(accel_backend.device_type, dtype=torch.bfloat16):
        # early_stop=False: the recomputation runs to the end, past the last saved tensor.
        out = checkpoint(fn, x, use_reentrant=reentrant, early_stop=False)
    out.float().sum().backward()
    assert seen == [torch.bfloat16, torch.bfloat16]
    assert not torch.is_autocast_enabled(accel_backend.device_type)


# Inputs and outputs ------------------------------------------------------------------------


class MultiIO(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)
        self.drop = nn.Dropout(0.25)

    def forward(
        self, x: torch.Tensor, scale: float, y: torch.Tensor, tag: str, index: torch.Tensor
    ) -> tuple[Any, ...]:
        h = self.drop(self.a(x)) * scale + self.b(y).index_select(0, index).sum(0)
        return h, tag.upper(), index * 2, torch.tanh(h) + y.mean(), 3


@pytest.mark.parametrize("reentrant", MODES)
def test_multiple_and_non_tensor_inputs_and_outputs(
    accel_backend: Accelerator, reentrant: bool
) -> None:
    make_tensors = inputs_factory(accel_backend, (5, 6), (5, 6))
    device = accel_backend.device()

    def make() -> tuple[Any, ...]:
        x, y = make_tensors()
        return x, y, torch.tensor([4, 0, 2], device=device)

    actual = compare(
        accel_backend,
        _model(MultiIO),
        make,
        lambda m, x, y, i: m(x, 0.5, y, "ok", i),
        lambda m, x, y, i: checkpoint(m, x, 0.5, y, "ok", i, use_reentrant=reentrant),
    )
    _h, tag, doubled, _second, three = actual["outputs"]
    assert (tag, three) == ("OK", 3)
    assert doubled.dtype == torch.int64 and doubled.tolist() == [8, 0, 4]


@pytest.mark.parametrize("reentrant", MODES)
def test_integer_inputs(accel_backend: Accelerator, reentrant: bool) -> None:
    embedding = _model(lambda: nn.Embedding(10, 8))
    device = accel_backend.device()

    def fn(m: nn.Module, tokens: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.dropout(m(tokens), 0.5) * x

    def make() -> tuple[Any, ...]:
        tokens = torch.tensor([[1, 2, 3], [7, 8, 9]], device=device)
        return tokens, torch.ones(2, 3, 8, device=device, requires_grad=True)

    compare(
        accel_backend,
        embedding,
        make,
        fn,
        lambda m, tokens, x: checkpoint(fn, m, tokens, x, use_reentrant=reentrant),
    )


@pytest.mark.parametrize("reentrant", MODES)
def test_inputs_not_requiring_grad(accel_backend: Accelerator, reentrant: bool) -> None:
    model = _model(Block)
    device = accel_backend.device()
    generator = torch.Generator().manual_seed(3)
    x_values = torch.randn(4, 16, generator=generator)
    mask_values = (torch.rand(4, 16, generator=generator) > 0.5).float()

    def fn(m: nn.Module, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return m(x) * mask

    def make() -> tuple[Any, ...]:
        return x_values.to(device, copy=True).requires_grad_(), mask_values.to(device)

    actual = compare(
        accel_backend,
        model,
        make,
        fn,
        lambda m, x, mask: checkpoint(
            lambda x, mask: fn(m, x, mask), x, mask, use_reentrant=reentrant
        ),
    )
    assert all(grad is not None for grad in actual["param_grads"])


def test_non_reentrant_gives_parameter_grads_when_no_input_requires_grad(
    accel_backend: Accelerator,
) -> None:
    actual = compare(
        accel_backend,
        _model(Block),
        inputs_factory(accel_backend, (4, 16), requires_grad=False),
        lambda m, x: m(x),
        lambda m, x: checkpoint(m, x, use_reentrant=False),
    )
    assert all(grad is not None for grad in actual["param_grads"])


# Sequential, wrapper, apply_activation_checkpointing ---------------------------------------


def _sequential() -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(12, 24),
        nn.ReLU(),
        nn.Dropout(0.2),
        nn.Linear(24, 24),
        nn.Tanh(),
        nn.Dropout(0.2),
        nn.Linear(24, 12),
    )


@pytest.mark.parametrize("segments", [1, 2, 3, 7])
@pytest.mark.parametrize("reentrant", MODES)
def test_checkpoint_sequential(accel_backend: Accelerator, reentrant: bool, segments: int) -> None:
    compare(
        accel_backend,
        _model(_sequential),
        inputs_factory(accel_backend, (6, 12)),
        lambda m, x: m(x),
        lambda m, x: checkpoint_sequential(m, segments, x, use_reentrant=reentrant),
    )


def _transformer_layer() -> nn.TransformerEncoderLayer:
    return nn.TransformerEncoderLayer(
        d_model=16, nhead=2, dim_feedforward=32, dropout=0.2, batch_first=True
    )


@pytest.mark.parametrize("reentrant", MODES)
def test_checkpoint_wrapper_on_transformer_block(
    accel_backend: Accelerator, reentrant: bool
) -> None:
    compare(
        accel_backend,
        _model(_transformer_layer),
        inputs_factory(accel_backend, (3, 5, 16)),
        lambda m, x: m(x),
        lambda m, x: m(x),
        wrap=lambda layer: checkpoint_wrapper(layer, use_reentrant=reentrant),
    )


@pytest.mark.parametrize("reentrant", MODES)
def test_checkpoint_wrapper_passes_keyword_arguments(
    accel_backend: Accelerator, reentrant: bool
) -> None:
    mask = torch.tensor([[False, False, False, True, True]] * 3, device=accel_backend.device())
    compare(
        accel_backend,
        _model(_transformer_layer),
        inputs_factory(accel_backend, (3, 5, 16)),
        lambda m, x: m(x, src_key_padding_mask=mask),
        lambda m, x: m(x, src_key_padding_mask=mask),
        wrap=lambda layer: checkpoint_wrapper(layer, use_reentrant=reentrant),
    )


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.layers = nn.ModuleList(_transformer_layer() for _ in range(3))
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


@pytest.mark.parametrize("reentrant", MODES)
def test_apply_activation_checkpointing(accel_backend: Accelerator, reentrant: bool) -> None:
    wrapped: list[str] = []

    def wrap(model: nn.Module) -> nn.Module:
        wrapped.extend(
            apply_activation_checkpointing(
                model,
                check_fn=lambda m: isinstance(m, nn.TransformerEncoderLayer),
                use_reentrant=reentrant,
            )
        )
        return model

    model = _model(Stack)
    actual = compare(
        accel_backend,
        model,
        inputs_factory(accel_backend, (2, 5, 8), requires_grad=False),
        lambda m, x: m(x),
        lambda m, x: m(x),
        wrap=wrap,
    )
    assert wrapped == ["layers.0", "layers.1", "layers.2"]
    assert all(grad is not None for grad in actual["param_grads"])


# Nesting, running statistics, no_grad --------------------------------------------------------


class Nested(nn.Module):
    def __init__(self, outer_reentrant: bool, inner_reentrant: bool) -> None:
        super().__init__()
        self.first = Block()
        self.second = Block()
        self.outer_reentrant = outer_reentrant
        self.inner_reentrant = inner_reentrant

    def inner(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x))

    def outer(self, x: torch.Tensor) -> torch.Tensor:
        h = checkpoint(self.first, x, use_reentrant=self.inner_reentrant)
        return checkpoint(self.second, torch.sin(h), use_reentrant=self.inner_reentrant) * 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.outer, x, use_reentrant=self.outer_reentrant)

    def plain(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.sin(self.first(x))) * 2


@pytest.mark.parametrize("inner", MODES)
@pytest.mark.parametrize("outer", MODES)
def test_nested_checkpoints(accel_backend: Accelerator, outer: bool, inner: bool) -> None:
    compare(
        accel_backend,
        _model(lambda: Nested(outer, inner)),
        inputs_factory(accel_backend, (4, 16)),
        lambda m, x: m.plain(x),
        lambda m, x: m(x),
    )


class Normed(nn.Module):
    def __init__(self, momentum: float | None) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.bn = nn.BatchNorm1d(6, momentum=momentum)
        self.drop = nn.Dropout(0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.bn(self.fc(x))).relu()


@pytest.mark.parametrize("momentum", [0.1, None], ids=["momentum", "cumulative"])
@pytest.mark.parametrize("reentrant", MODES)
def test_batch_norm_running_stats_update_once(
    accel_backend: Accelerator, reentrant: bool, momentum: float | None
) -> None:
    model = _model(lambda: Normed(momentum))
    buffers_before = dict(model.bn.named_buffers())
    actual = compare(
        accel_backend,
        model,
        inputs_factory(accel_backend, (8, 6)),
        lambda m, x: m(x),
        lambda m, x: checkpoint(m, x, use_reentrant=reentrant),
    )
    running_mean, _running_var, num_batches_tracked = actual["buffers"]
    assert num_batches_tracked.item() == 1
    assert not torch.equal(running_mean.cpu(), buffers_before["running_mean"].cpu())


@pytest.mark.parametrize("reentrant", MODES)
def test_batch_norm_buffers_stay_the_same_objects(
    accel_backend: Accelerator, reentrant: bool
) -> None:
    model = _model(lambda: Normed(0.1)).to(accel_backend.device())
    before = {name: buffer for name, buffer in model.named_buffers()}
    x = torch.randn(8, 6, device=accel_backend.device(), requires_grad=True)
    for _ in range(2):
        checkpoint(model, x, use_reentrant=reentrant).sum().backward()
    after = dict(model.named_buffers())
    assert all(after[name] is before[name] for name in before)
    assert model.bn.num_batches_tracked.item() == 2


@pytest.mark.parametrize("reentrant", MODES)
def test_batch_norm_inside_wrapper(accel_backend: Accelerator, reentrant: bool) -> None:
    compare(
        accel_backend,
        _model(lambda: nn.Sequential(Normed(0.1), Normed(None))),
        inputs_factory(accel_backend, (8, 6)),
        lambda m, x: m(x),
        lambda m, x: m(x),
        wrap=lambda m: (
            apply_activation_checkpointing(
                m, check_fn=lambda sub: isinstance(sub, Normed), use_reentrant=reentrant
            ),
            m,
        )[1],
    )


@pytest.mark.parametrize("reentrant", MODES)
def test_checkpoint_inside_no_grad_is_a_plain_call(
    accel_backend: Accelerator, reentrant: bool
) -> None:
    model = _model(Block).to(accel_backend.device())
    x = torch.randn(4, 16, device=accel_backend.device(), requires_grad=True)
    # Both generators: torch.manual_seed does not seed every device's (XLA's).
    torch.manual_seed(SEED)
    accel_backend.manual_seed(SEED)
    expected = model(x)
    torch.manual_seed(SEED)
    accel_backend.manual_seed(SEED)
    with torch.no_grad():
        actual = checkpoint(model, x, use_reentrant=reentrant)
    assert not actual.requires_grad
    assert_same(actual, expected.detach(), accel_backend, "output")


# Non-reentrant features: kwargs, autograd.grad, partial backward -----------------------------


def test_keyword_arguments_non_reentrant(accel_backend: Accelerator) -> None:
    def fn(m: nn.Module, x: torch.Tensor, *, scale: torch.Tensor, shift: float = 0.0) -> Any:
        return m(x) * scale + shift

    device = accel_backend.device()
    make_x = inputs_factory(accel_backend, (4, 16))

    def make() -> tuple[Any, ...]:
        (x,) = make_x()
        return x, torch.full((16,), 1.5, device=device, requires_grad=True)

    actual = compare(
        accel_backend,
        _model(Block),
        make,
        lambda m, x, s: fn(m, x, scale=s, shift=0.25),
        lambda m, x, s: checkpoint(fn, m, x, scale=s, shift=0.25, use_reentrant=False),
    )
    assert actual["input_grads"][1] is not None


def test_autograd_grad_non_reentrant(accel_backend: Accelerator) -> None:
    def backward(outputs: Any, inputs: tuple[Any, ...], model: nn.Module) -> None:
        params = list(model.parameters())
        grads = torch.autograd.grad(_loss(outputs), [*inputs, *params])
        for tensor, grad in zip([*inputs, *params], grads, strict=True):
            tensor.grad = grad

    compare(
        accel_backend,
        _model(Block),
        inputs_factory(accel_backend, (4, 16)),
        lambda m, x: m(x),
        lambda m, x: checkpoint(m, x, use_reentrant=False),
        backward=backward,
    )


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = Block()
        self.left = nn.Linear(16, 4)
        self.right = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(x)
        return self.left(h), self.right(h)


@pytest.mark.parametrize("reentrant", MODES)
def test_partial_backward(accel_backend: Accelerator, reentrant: bool) -> None:
    def backward(outputs: Any, inputs: tuple[Any, ...], model: nn.Module) -> None:
        left, _right = outputs
        (left**2).sum().backward()

    actual = compare(
        accel_backend,
        _model(TwoHeads),
        inputs_factory(accel_backend, (4, 16)),
        lambda m, x: m(x),
        lambda m, x: checkpoint(m, x, use_reentrant=reentrant),
        backward=backward,
    )
    model_grads = actual["param_grads"]
    assert model_grads[-1] is None or not model_grads[-1].any()  # the right head


def test_backward_with_inputs_non_reentrant(accel_backend: Accelerator) -> None:
    def backward(outputs: Any, inputs: tuple[Any, ...], model: nn.Module) -> None:
        _loss(outputs).backward(inputs=list(inputs))

    actual = compare(
        accel_backend,
        _model(Block),
        inputs_factory(accel_backend, (4, 16)),
        lambda m, x: m(x),
        lambda m, x: checkpoint(m, x, use_reentrant=False),
        backward=backward,
    )
    assert all(grad is None for grad in actual["param_grads"])


def test_retain_graph_recomputes_again_non_reentrant(accel_backend: Accelerator) -> None:
    calls = []

    def backward(outputs: Any, inputs: tuple[Any, ...], model: nn.Module) -> None:
        loss = _loss(outputs)
        loss.backward(retain_graph=True)
        loss.backward()

    def counted(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return m(x)

    compare(
        accel_backend,
        _model(Block),
        inputs_factory(accel_backend, (4, 16)),
        lambda m, x: m(x),
        lambda m, x: checkpoint(counted, m, x, use_reentrant=False),
        backward=backward,
    )
    assert len(calls) == 3  # forward, and one recomputation per backward


# Offload ---------------------------------------------------------------------------------------


def _mlp_block() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Dropout(0.2), nn.Linear(32, 16))


BLOCKS = [
    pytest.param(_transformer_layer, id="transformer"),
    pytest.param(_mlp_block, id="mlp"),
]


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("reentrant", MODES)
def test_offload_to_cpu(
    accel_backend: Accelerator, reentrant: bool, block: Callable[[], nn.Module]
) -> None:
    def wrap(model: nn.Module) -> nn.Module:
        wrapped = checkpoint_wrapper(model, offload_to_cpu=True, use_reentrant=reentrant)
        assert isinstance(wrapped, CheckpointWrapper) and wrapped.offload_to_cpu
        return wrapped

    compare(
        accel_backend,
        _model(block),
        inputs_factory(accel_backend, (3, 5, 16)),
        lambda m, x: m(x),
        lambda m, x: m(x),
        wrap=wrap,
    )


@pytest.mark.parametrize("reentrant", MODES)
def test_offload_to_cpu_with_apply(accel_backend: Accelerator, reentrant: bool) -> None:
    compare(
        accel_backend,
        _model(Stack),
        inputs_factory(accel_backend, (2, 5, 8)),
        lambda m, x: m(x),
        lambda m, x: m(x),
        wrap=lambda m: (
            apply_activation_checkpointing(
                m,
                check_fn=lambda sub: isinstance(sub, nn.TransformerEncoderLayer),
                offload_to_cpu=True,
                use_reentrant=reentrant,
            ),
            m,
        )[1],
    )
