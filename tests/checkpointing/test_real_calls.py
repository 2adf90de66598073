"""Module calls whose inputs a real forward gives otherwise than the fake step are found.

transformers builds its attention mask whenever the padding mask is a ``FakeTensor`` and
skips it in a real forward with nothing padded, so on fake tensors its decoder layers
receive a mask they never receive in training. ``_Branching`` does the same in plain
torch. Before the planner held a real forward's calls against the fake step's, such a
layer planned at the saved-tensor grain met another list of saved tensors at its first
real call and fell back, with a warning, to a whole checkpoint.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from _grain_rates import SAVED_GRAIN_FREE  # loaded by tests/conftest.py
from _same_steps import assert_same_steps  # loaded by tests/conftest.py
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

import accel
from accel._compat import fake_profile_unavailable
from checkpointing import CheckpointPlan, plan_checkpointing
from checkpointing._decisions import SAVED
from checkpointing.planner import _real_calls, profile_step
from checkpointing.planner._data_shapes import decides_shape
from checkpointing.planner._profile import profile_step as record_step
from checkpointing.planner._real_calls import RealCall, RealCalls, unlike_real
from checkpointing.planner._records import ModuleProfile, RecordedStep

WIDTH, SEQ, BATCH = 16, 8, 2


class _Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.linear = nn.Linear(WIDTH, WIDTH)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.linear(self.norm(x))
        if bias is not None:
            hidden = hidden + bias
        return x + self.drop(nn.functional.gelu(hidden) * torch.sigmoid(hidden))


class _Masked(nn.Module):
    """Layers that take a bias built from a padding mask.

    ``mode``: ``"integer"`` indexes the mask with integer tensors, as transformers
    does; ``"boolean"`` selects rows with it (the data decides the shape);
    ``"branching"`` also skips the bias where nothing is padded, unless the mask is
    fake (transformers' ``is_tracing``); ``"reshaped"`` gives a bias of another shape
    there instead of none.
    """

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.layers = nn.ModuleList(_Layer() for _ in range(3))
        self.head = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        bias: torch.Tensor | None
        if self.mode == "boolean":
            bias = x[padding].sum(0)
        elif self.mode == "branching" and not isinstance(padding, FakeTensor) and padding.all():
            bias = None
        elif self.mode == "reshaped" and not isinstance(padding, FakeTensor) and padding.all():
            bias = torch.zeros(1, 1, 1, dtype=x.dtype)
        else:
            batch = torch.arange(BATCH)[:, None]
            position = torch.arange(SEQ)[None, :]
            bias = padding[batch, position].to(x.dtype)[..., None]
        for layer in self.layers:
            x = layer(x, bias)
        return self.head(x)


def _case(mode: str, padded: bool = False) -> tuple[_Masked, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = _Masked(mode).train()
    x = torch.randn(BATCH, SEQ, WIDTH, generator=torch.Generator().manual_seed(1))
    padding = torch.ones(BATCH, SEQ, dtype=torch.bool)
    if padded:
        padding[1, -3:] = False
    return model, x, padding


def _planned_exactly(
    reference: nn.Module, inputs: tuple[torch.Tensor, ...], recorded: RecordedStep
) -> CheckpointPlan:
    """The plan at 0.6 with the saved-tensor grain free, applied to a copy that trains
    bit for bit as ``reference`` does, with no warning."""
    plan = plan_checkpointing(
        reference, inputs, 0.6, selective=False, rates=SAVED_GRAIN_FREE, profile=recorded
    )
    model = copy.deepcopy(reference)
    plan.apply(model)
    assert_same_steps(model, reference, *inputs)
    return plan


def test_integer_indexing_decides_no_shape_and_a_boolean_mask_does() -> None:
    index = torch.ops.aten.index.Tensor
    table = torch.zeros(4, 5)
    assert not decides_shape(index, (table, [torch.tensor([0, 2]), None]), {})
    assert decides_shape(index, (table, [table[:, 0] > 0]), {})
    assert decides_shape(index, (table, [torch.tensor([1, 0, 1, 0], dtype=torch.uint8)]), {})
    assert decides_shape(torch.ops.aten.nonzero.default, (table,), {})
    assert not decides_shape(torch.ops.aten.add.Tensor, (table, table), {})


def test_layers_reached_by_an_integer_indexed_mask_keep_the_saved_grain() -> None:
    reference, x, padding = _case("integer")
    recorded = profile_step(reference, (x, padding))
    assert recorded.unlike_real == ()
    for name in ("layers.0", "layers.1", "layers.2"):
        assert not recorded.modules[name].data_dependent
        assert not recorded.modules[name].unlike_real
    plan = _planned_exactly(reference, (x, padding), recorded)
    assert SAVED in plan.decisions.values()


def test_a_boolean_mask_still_marks_the_layers_it_reaches() -> None:
    model, x, padding = _case("boolean", padded=True)
    recorded = profile_step(model, (x, padding))
    assert all(recorded.modules[f"layers.{i}"].data_dependent for i in range(3))


def test_a_mask_only_fake_tensors_get_is_left_out_as_the_real_forward_leaves_it() -> None:
    reference, x, padding = _case("branching")
    generator = torch.random.get_rng_state()
    recorded = profile_step(reference, (x, padding))
    assert torch.equal(torch.random.get_rng_state(), generator), "the real forward drew nothing"
    if fake_profile_unavailable() is not None:
        # torch 2.4: the profile is itself one real forward, which takes the real branch.
        assert recorded.fallback and recorded.unlike_real == () and recorded.aligned == {}
        assert SAVED in _planned_exactly(reference, (x, padding), recorded).decisions.values()
        return
    assert recorded.unlike_real == ()
    assert recorded.aligned == {f"layers.{i}": ("argument 1",) for i in range(3)}
    # Profiled without the bias, each layer saves what it saves in training.
    assert recorded.modules["layers.0"].input_shapes == ((BATCH, SEQ, WIDTH),)
    plan = _planned_exactly(reference, (x, padding), recorded)
    assert SAVED in plan.decisions.values()
    assert "where a real forward passes None (argument 1" in plan.note
    assert "'layers.0'" in plan.note


def test_calls_a_real_forward_gives_other_shapes_are_planned_whole_and_named() -> None:
    reference, x, padding = _case("reshaped")
    recorded = profile_step(reference, (x, padding))
    if fake_profile_unavailable() is not None:
        assert recorded.fallback and recorded.unlike_real == ()
        return
    assert {"layers.0", "layers.1", "layers.2"} <= set(recorded.unlike_real)
    assert "head" not in recorded.unlike_real and recorded.aligned == {}
    plan = _planned_exactly(reference, (x, padding), recorded)
    assert all(
        decision != SAVED for name, decision in plan.decisions.items() if "layers" in name
    ), plan.decisions
    assert "get other tensor inputs in a real forward" in plan.note
    assert "'layers.0'" in plan.note


def test_only_a_tensor_the_real_call_passes_as_none_is_replaced() -> None:
    mask = torch.ones(2)
    calls = RealCalls()
    calls.calls["layer", 0] = RealCall(
        ((2,),), 2, frozenset({"mask", "scale"}), frozenset({1, "mask", "scale"})
    )
    args, kwargs, replaced = calls.align("layer", 0, (mask, mask), {"mask": mask, "scale": 2.0})
    assert args == (mask, None) and kwargs == {"mask": None, "scale": 2.0}
    assert replaced == ("argument 1", "mask")
    # Another count of arguments, other keywords or another call: left as they are.
    for call, arguments, keywords in (
        (0, (mask,), {"mask": mask, "scale": 2.0}),
        (0, (mask, mask), {"mask": mask}),
        (1, (mask, mask), {"mask": mask, "scale": 2.0}),
    ):
        assert calls.align("layer", call, arguments, keywords) == (arguments, keywords, ())


def test_padded_inputs_take_the_same_branch_and_keep_the_saved_grain() -> None:
    reference, x, padding = _case("branching", padded=True)
    recorded = profile_step(reference, (x, padding))
    assert recorded.unlike_real == ()
    plan = _planned_exactly(reference, (x, padding), recorded)
    assert SAVED in plan.decisions.values()


@pytest.mark.skipif(
    fake_profile_unavailable() is not None,
    reason=f"profiles a real forward here, which is the check: {fake_profile_unavailable()}",
)
def test_a_lazy_backend_runs_no_real_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    reference, x, padding = _case("branching")
    backend = accel.get_backend("cpu")
    asked: list[bool] = []

    def lazy(self: object) -> bool:
        asked.append(True)
        return True

    monkeypatch.setattr(type(backend), "is_lazy", property(lazy))
    monkeypatch.setattr(_real_calls, "call_model", _never)
    recorded = record_step(reference, (x, padding), backend)
    assert asked and recorded.unlike_real == ()


def _never(*args: object, **kwargs: object) -> None:
    raise AssertionError("a real forward ran on a lazy backend")


def _record(
    name: str, module: str, children: list[str], shapes: tuple[tuple[int, ...], ...]
) -> ModuleProfile:
    return ModuleProfile(name, module=module, children=children, input_shapes=shapes)


def test_a_differing_call_marks_the_calls_around_it() -> None:
    one = ((2, 3),)
    modules = {
        "": _record("", "", ["a", "b"], one),
        "a": _record("a", "a", ["a.x"], one),
        "a.x": _record("a.x", "a.x", [], one),
        "b": _record("b", "b", ["b.y"], one),
        "b.y": _record("b.y", "b.y", [], one),
    }
    real = {"": one, "a": one, "a.x": ((2, 3), (2, 2)), "b": one, "b.y": one}
    assert unlike_real(modules, real) == ("", "a", "a.x")
    assert not modules["b"].unlike_real and not modules["b.y"].unlike_real
    # A call only the real forward makes marks the calls along its module's path.
    for record in modules.values():
        record.unlike_real = False
    assert unlike_real(modules, {**real, "a.x": one, "b.z": one}) == ("", "b")


def test_a_model_whose_forward_runs_collectives_gets_no_real_forward(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Planning runs on rank 0 alone: DDP's forward broadcasts buffers (batch norm's
    # statistics here), which would wait for ranks that never join.
    import torch.distributed as dist

    reference = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.BatchNorm1d(WIDTH)).train()
    x = torch.randn(BATCH * SEQ, WIDTH, generator=torch.Generator().manual_seed(1))
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        wrapped = nn.parallel.DistributedDataParallel(reference)
        monkeypatch.setattr(_real_calls, "call_model", _never)
        recorded = record_step(wrapped, (x,), accel.get_backend("cpu"))
    finally:
        dist.destroy_process_group()
    assert recorded.unlike_real == ()
    assert not any(record.unlike_real for record in recorded.modules.values())
