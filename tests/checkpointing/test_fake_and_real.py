"""Where the fake step and the real one differ, a plan never breaks the step.

The planner plans on a fake-tensor step. On the CPU, batch normalisation's fake kernel
keeps a transposed input's strides where the real kernel writes contiguously
(pytorch/pytorch#192668), so a model that normalises channels over a transposed input
(transformers' PatchTST) ran other operators, and saved other tensors, in its real
step than in the profile: its first real step raised, or its gradients silently
differed from the plain model's. The profile now lays such outputs out as the kernel
does; and the saved-tensor wrapper checks its first real call against the plan, and
checkpoints a module whole (exact, with one warning) where the device does otherwise.

A grouped matrix product (``aten._grouped_mm``, how transformers 5 runs a mixture of
experts' experts) in float32 runs on the CPU, but the fake kernel of torch 2.9 to 2.13
refuses it, so such a model was profiled on real tensors, its backward guessed. The
profile now shapes that product's output as the kernel does.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from _grain_rates import SAVED_GRAIN_FREE  # loaded by tests/conftest.py
from torch import nn

from accel._compat import fake_profile_unavailable
from checkpointing import plan_checkpointing
from checkpointing._decisions import SAVED
from checkpointing._measure import LiveActivationMeter
from checkpointing.planner import _layouts
from checkpointing.planner._layouts import DeviceLayouts

WIDTH, CHANNELS, BATCH, BLOCKS = 16, 6, 4, 3


class Block(nn.Module):
    """A time-series encoder layer: batch norm over the channels of a transposed input."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(WIDTH)
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.down = nn.Linear(4 * WIDTH, WIDTH)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = self.norm(x.transpose(1, 2)).transpose(1, 2)
        return x + self.drop(self.down(F.gelu(self.up(normed))))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(Block() for _ in range(BLOCKS)))
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


def _inputs() -> torch.Tensor:
    return torch.randn(BATCH, CHANNELS, WIDTH, generator=torch.Generator().manual_seed(1))


def _steps(model: nn.Module, inputs: Any, count: int = 2) -> list[list[torch.Tensor | None]]:
    """``count`` training steps (SGD between them): each step's loss and gradients."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    results = []
    for step in range(count):
        torch.manual_seed(10 + step)
        output = model(**inputs) if isinstance(inputs, dict) else model(*inputs)
        loss = output if isinstance(output, torch.Tensor) else output.loss
        loss = loss.float().square().mean()
        loss.backward()
        results.append([loss.detach(), *(p.grad for p in model.parameters())])
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
    return results


def _assert_exact(model: nn.Module, reference: nn.Module, inputs: Any) -> None:
    for got, expected in zip(_steps(model, inputs), _steps(reference, inputs), strict=True):
        for a, b in zip(got, expected, strict=True):
            assert (a is None and b is None) or (a is not None and b is not None)
            assert a is None or torch.equal(a, b)
    for a, b in zip(model.buffers(), reference.buffers(), strict=True):
        assert torch.equal(a, b)  # running statistics: each forward ran once


def _plan(model: nn.Module, inputs: Any, budget: float = 0.5) -> Any:
    plan = plan_checkpointing(model, inputs, memory_budget=budget, rates=SAVED_GRAIN_FREE)
    if fake_profile_unavailable() is None:
        assert "Profiled on real tensors" not in plan.note
    return plan


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(4, 6, 16).transpose(1, 2),  # (N, C, L) from (N, L, C)
        lambda: torch.randn(2, 5, 6, 3).permute(0, 3, 1, 2),  # channels-last strides
        lambda: torch.randn(2, 3, 6, 5).transpose(2, 3),  # neither
        lambda: torch.randn(2, 3, 4, 5, 6).permute(0, 1, 4, 3, 2),
        lambda: torch.randn(2, 4, 3, 5, 6).permute(0, 2, 1, 3, 4),  # channels-last 3d order
        lambda: torch.randn(4, 3, 8),  # contiguous
    ],
)
def test_batch_norm_is_laid_out_as_the_cpu_kernel_lays_it_out(make: Any, training: bool) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = make()
    channels = x.shape[1]
    stats = (torch.zeros(channels), torch.ones(channels))
    affine = (torch.randn(channels), torch.randn(channels))

    def norm(x: torch.Tensor, *tensors: torch.Tensor) -> torch.Tensor:
        mean, var, weight, bias = tensors
        return F.batch_norm(x, mean, var, weight, bias, training=training)

    real = norm(x, *stats, *affine)
    mode = FakeTensorMode()
    with mode:
        fakes = [mode.from_tensor(t) for t in (x, *stats, *affine)]
    with mode, DeviceLayouts():
        fake = norm(*fakes)
    assert fake.shape == real.shape and fake.stride() == real.stride()


def test_a_transposed_batch_norm_plans_at_the_saved_grain_and_trains_exactly() -> None:
    torch.manual_seed(0)
    model = Model().train()
    reference = copy.deepcopy(model)
    plan = _plan(model, (_inputs(),))
    assert SAVED in plan.decisions.values() or fake_profile_unavailable()
    plan.apply(model)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="checkpointing")  # the check finds it true
        _assert_exact(model, reference, (_inputs(),))


def _live_bytes(model: nn.Module, x: torch.Tensor) -> int:
    """Bytes the forward keeps for backward (its output's excluded)."""
    with LiveActivationMeter(exclude=[*model.parameters(), *model.buffers()]) as meter:
        out = model(x)
    held = meter.bytes - out.untyped_storage().nbytes()
    out.sum().backward()
    return held


def test_a_checked_first_call_keeps_what_the_plan_keeps() -> None:
    torch.manual_seed(0)
    model = Model().train()
    plain = _live_bytes(copy.deepcopy(model), _inputs())
    _plan(model, (_inputs(),)).apply(model)
    first, second = _live_bytes(model, _inputs()), _live_bytes(model, _inputs())
    assert first == second < plain


def test_the_first_call_finds_a_plan_the_device_does_not_follow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if fake_profile_unavailable() is not None:
        pytest.skip(
            f"a real-tensor profile saves what the step saves: {fake_profile_unavailable()}"
        )

    # As if batch norm's layout were not known: the profile keeps the fake kernel's.
    def fake_layouts(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))

    monkeypatch.setattr(_layouts.DeviceLayouts, "__torch_dispatch__", fake_layouts)
    torch.manual_seed(0)
    model = Model().train()
    reference = copy.deepcopy(model)
    plain = _live_bytes(copy.deepcopy(model), _inputs())
    plan = _plan(model, (_inputs(),))
    saved = [name for name, decision in plan.decisions.items() if decision == SAVED]
    assert saved
    plan.apply(model)
    with pytest.warns(UserWarning, match="checkpointed whole instead") as record:
        _assert_exact(model, reference, (_inputs(),))
    differs = [str(w.message) for w in record if "fake-tensor step" in str(w.message)]
    assert len(differs) == len(saved)  # one per module, on its first call only
    assert all("saved tensor" in message for message in differs)
    # Checkpointed whole from then on: less than the plain step keeps.
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="checkpointing")
        assert _live_bytes(model, _inputs()) < plain


def _patchtst(transformers: Any) -> nn.Module:
    config = transformers.PatchTSTConfig(
        num_input_channels=3,
        context_length=32,
        patch_length=8,
        patch_stride=8,
        prediction_length=8,
        d_model=16,
        num_attention_heads=2,
        num_hidden_layers=2,
        ffn_dim=32,
        norm_type="batchnorm",
        dropout=0.1,
        ff_dropout=0.1,
    )
    return transformers.PatchTSTForPrediction(config)


def _patchtsmixer(transformers: Any) -> nn.Module:
    config = transformers.PatchTSMixerConfig(
        num_input_channels=3,
        context_length=32,
        patch_length=8,
        patch_stride=8,
        prediction_length=8,
        d_model=16,
        num_layers=2,
        norm_mlp="BatchNorm",
        dropout=0.1,
    )
    return transformers.PatchTSMixerForPrediction(config)


@pytest.mark.parametrize("family", [_patchtst, _patchtsmixer])
def test_transformers_time_series_models_with_batch_norm(family: Any) -> None:
    # PatchTST's gradients differed silently from the plain model's; PatchTSMixer's
    # first step raised "saved tensor 1 has another shape, layout or dtype".
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    try:
        model = family(transformers).train()
    except AttributeError as error:  # an older transformers without the family
        pytest.skip(f"transformers {transformers.__version__}: {error}")
    generator = torch.Generator().manual_seed(1)
    inputs = {
        "past_values": torch.randn(4, 32, 3, generator=generator),
        "future_values": torch.randn(4, 8, 3, generator=generator),
    }
    reference = copy.deepcopy(model)
    plan = _plan(model, inputs)
    assert SAVED in plan.decisions.values() or fake_profile_unavailable()
    plan.apply(model)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="checkpointing")
        _assert_exact(model, reference, inputs)


_GROUPED = pytest.mark.skipif(
    not hasattr(torch.ops.aten, "_grouped_mm"),
    reason="this torch has no aten._grouped_mm (added in 2.8)",
)
_OFFS = [4, 4, 12]  # three groups, the second empty


@_GROUPED
@pytest.mark.parametrize(
    ("first", "second", "offs"),
    [
        ((12, 8), (3, 8, 4), _OFFS),
        ((3, 4, 8), (3, 8, 4), None),
        ((3, 4, 8), (8, 12), _OFFS),
        ((4, 12), (12, 8), _OFFS),
    ],
    ids=["2d-3d", "3d-3d", "3d-2d", "2d-2d"],
)
def test_a_float32_grouped_product_is_shaped_as_the_cpu_kernel_shapes_it(
    first: tuple[int, ...], second: tuple[int, ...], offs: list[int] | None
) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    tensors = [torch.randn(first), torch.randn(second)]
    if offs is not None:
        tensors.append(torch.tensor(offs, dtype=torch.int32))
    real = torch.ops.aten._grouped_mm.default(*tensors)
    mode = FakeTensorMode()
    with mode:
        fakes = [mode.from_tensor(t) for t in tensors]
    with mode, DeviceLayouts():
        fake = torch.ops.aten._grouped_mm.default(*fakes)
    assert (fake.shape, fake.stride(), fake.dtype) == (real.shape, real.stride(), real.dtype)


@_GROUPED
def test_a_grouped_product_of_mixed_dtypes_is_refused_in_the_fake_step() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    with mode:
        first, second = torch.randn(8, 8), torch.randn(2, 8, 4, dtype=torch.float64)
        offs = torch.tensor([4, 8], dtype=torch.int32)
    with mode, DeviceLayouts(), pytest.raises(RuntimeError, match="_grouped_mm"):
        torch.ops.aten._grouped_mm.default(first, second, offs)


class Experts(nn.Module):
    """A mixture of experts as transformers 5 runs it: tokens sorted by their expert,
    each expert's rows multiplied by its weight in one grouped product."""

    def __init__(self, experts: int = 4) -> None:
        super().__init__()
        self.experts = experts
        self.gate = nn.Linear(WIDTH, experts, bias=False)
        self.up = nn.Parameter(torch.randn(experts, WIDTH, 2 * WIDTH) / 4)
        self.down = nn.Parameter(torch.randn(experts, 2 * WIDTH, WIDTH) / 4)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, WIDTH)
        weights, chosen = self.gate(tokens).softmax(-1).max(-1)
        order = chosen.argsort(stable=True)
        counts = torch.histc(chosen.float(), bins=self.experts, min=0, max=self.experts - 1)
        offs = counts.cumsum(0).to(torch.int32)
        up = torch._grouped_mm(tokens[order], self.up, offs=offs)
        routed = torch._grouped_mm(self.drop(F.gelu(up)), self.down, offs=offs)
        out = torch.empty_like(routed).index_copy(0, order, routed) * weights[:, None]
        return x + out.reshape(x.shape)


@_GROUPED
def test_a_float32_mixture_of_experts_plans_on_fake_tensors_and_trains_exactly() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(*(Experts() for _ in range(BLOCKS)), nn.Linear(WIDTH, 1)).train()
    reference = copy.deepcopy(model)
    inputs = (torch.randn(BATCH, 8, WIDTH, generator=torch.Generator().manual_seed(1)),)
    plan = _plan(model, inputs)  # asserts the profile ran on fake tensors
    assert plan.decisions  # something is recomputed at 0.5
    plan.apply(model)
    _assert_exact(model, reference, inputs)


@_GROUPED
def test_a_float32_mixture_of_experts_has_its_operators_calibrated() -> None:
    # calibrate_rates records the step on fake tensors as the profile does: without the
    # profile's layouts the fake grouped product refuses float32 (torch 2.13), and the
    # calibration of Mixtral failed.
    from checkpointing.planner._calibration import _operator_rates

    model = nn.Sequential(*(Experts() for _ in range(BLOCKS)), nn.Linear(WIDTH, 1)).train()
    inputs = (torch.randn(BATCH, 8, WIDTH),)
    operators = {str(call.func) for call in _operator_rates.record_calls(model, inputs)}
    assert "aten.gelu.default" in operators and "aten.index_copy.default" in operators
