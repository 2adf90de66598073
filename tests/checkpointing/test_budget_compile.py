"""A budget plan under torch.compile: no added graph break, its estimate holds, exact.

The flow users follow: plan and apply in eager mode, then ``torch.compile`` the model
(``aot_eager`` here, on the CPU). For the zoo's Qwen2-like decoder (plain torch), a
GPT-2 (transformers) and the zoo's ResNet with batch norm, against the same model
compiled without a plan:

* the plan's wrappers add no graph break (dynamo's ``graph_break`` counter);
* the compiled step saves at most the plan's estimate plus 2% of the plain step's
  activations (the storages its autograd graph saves, walked as ``bench_budget.py
  --compile`` does: :func:`checkpointing._measure.graph_saved_bytes`);
* the loss, every gradient and batch norm's running statistics are bit-equal to the
  compiled plain model's (on the CPU the compiled regions replay the dropout masks).
"""

from __future__ import annotations

import copy
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from _grain_rates import REGIONS_FREE, SAVED_GRAIN_FREE  # loaded by tests/conftest.py
from torch import nn

from accel._compat import compiled_plans_unavailable
from checkpointing import (
    CheckpointPlan,
    DeviceRates,
    SavedTensorMeter,
    checkpoint_wrapper,
    plan_checkpointing,
)
from checkpointing._decisions import FULL, KEEP, SAVED, SELECTIVE
from checkpointing._measure import graph_saved_bytes

zoo = sys.modules["accel_zoo"]  # loaded by tests/conftest.py

UNAVAILABLE = compiled_plans_unavailable()
pytestmark = [
    pytest.mark.skipif(UNAVAILABLE is not None, reason=str(UNAVAILABLE)),
    # Raised inside torch while it compiles, with or without accel.
    pytest.mark.filterwarnings(
        "ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning"
    ),
    pytest.mark.filterwarnings("ignore:Guards may run slower on Python 3.13.0:RuntimeWarning"),
]
NO_TRANSFORMERS = zoo.unusable("gpt2")


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Case:
    """A model, how to call it, its loss, and the budget it is planned at."""

    def __init__(
        self,
        model: nn.Module,
        inputs: tuple[Any, ...],
        loss: Callable[[Any], torch.Tensor],
        budget: float,
        rates: DeviceRates | None = None,
    ) -> None:
        self.model, self.inputs, self.loss, self.budget = model, inputs, loss, budget
        self.rates = rates


def _zoo_case(family: str) -> Case:
    case = zoo.build(family)
    return Case(case.model, case.inputs, case.loss_of, 0.5)


def _gpt2() -> Case:
    # Wide and long enough that the generator state kept per recomputed dropout (5,056
    # bytes on the CPU) stays under 1% of the step; at 0.25 its attention modules are
    # checkpointed whole, called with transformers' bool and tuple keyword arguments.
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=512, use_cache=False
    )
    ids = torch.randint(512, (4, 64), generator=torch.Generator().manual_seed(1))

    def loss(out: Any) -> torch.Tensor:
        logits = out.logits[:, :-1].reshape(-1, 512)
        return nn.functional.cross_entropy(logits, ids[:, 1:].reshape(-1))

    return Case(GPT2LMHeadModel(config), (ids,), loss, 0.25)


def _albert() -> Case:
    # ALBERT's one layer group runs at every depth. At 0.25 the plan checkpoints the
    # group's first calls whole and the layer's activation at the last call alone: the
    # activation's calls inside the checkpointed groups run in a region that dynamo
    # traces as one operator, where counting them would break the graph.
    from transformers import AlbertConfig, AlbertForMaskedLM

    torch.manual_seed(0)
    config = AlbertConfig(
        vocab_size=512,
        embedding_size=32,
        hidden_size=64,
        num_hidden_layers=6,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=64,
    )
    ids = torch.randint(512, (4, 64), generator=torch.Generator().manual_seed(1))

    def loss(out: Any) -> torch.Tensor:
        return nn.functional.cross_entropy(out.logits.reshape(-1, 512), ids.reshape(-1))

    # At this size one checkpoint's own cost outweighs recomputing any call: priced
    # without it, the plan nests regions as the case needs.
    return Case(AlbertForMaskedLM(config), (ids,), loss, 0.25, REGIONS_FREE)


def _resnet() -> Case:
    # The zoo's ResNet at 16 images of 24 x 24: a compiled region that recomputes a
    # Dropout2d keeps the host generator's state (5,056 bytes), more than 2% of the
    # test size's whole step (0.18 MiB) but under 0.5% of this one's; the plan's note
    # gives the compiled estimate with it (checkpointing/planner/_compiled.py).
    model = zoo.build("resnet").model
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(16, 3, 24, 24, generator=generator)
    labels = torch.randint(10, (16,), generator=generator)
    return Case(model, (images,), lambda out: nn.functional.cross_entropy(out, labels), 0.5)


CASES = [
    pytest.param(lambda: _zoo_case("qwen2"), id="qwen2"),
    pytest.param(
        _gpt2,
        id="gpt2",
        marks=pytest.mark.skipif(NO_TRANSFORMERS is not None, reason=str(NO_TRANSFORMERS)),
    ),
    pytest.param(
        _albert,
        id="albert",
        marks=pytest.mark.skipif(NO_TRANSFORMERS is not None, reason=str(NO_TRANSFORMERS)),
    ),
    pytest.param(_resnet, id="resnet"),
]


def _compiled_step(case: Case, model: nn.Module) -> tuple[int, int, list[torch.Tensor]]:
    """Graph breaks, saved bytes, then loss, gradients and buffers of one compiled step."""
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(model, backend="aot_eager")
    torch.manual_seed(7)
    out = compiled(*case.inputs)
    breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    saved = graph_saved_bytes(
        out if isinstance(out, torch.Tensor) else out.logits,
        [*model.parameters(), *model.buffers()],
    )
    loss = case.loss(out)
    loss.backward()
    grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in model.parameters()]
    return breaks, saved, [loss.detach(), *grads, *model.buffers()]


@pytest.mark.parametrize("build", CASES)
def test_a_compiled_plan_adds_no_graph_break_keeps_its_estimate_and_is_exact(
    build: Callable[[], Case],
) -> None:
    case = build()
    planned = copy.deepcopy(case.model)
    plan = plan_checkpointing(planned, case.inputs, case.budget, rates=case.rates)
    plan.apply(planned)
    if build is _albert:  # the case is there for calls inside a planned region
        assert plan.enclosed, plan
    breaks, plain_saved, expected = _compiled_step(case, case.model)
    torch._dynamo.reset()
    planned_breaks, saved, got = _compiled_step(case, planned)
    assert planned_breaks == breaks
    assert saved <= plan.estimated_bytes + 0.02 * plan.plain_bytes, plan
    compiled = plan.compiled_estimated_bytes
    assert compiled is not None
    if "recompute saved" not in plan.decisions.values():
        # Every region compiles as planned: the compiled estimate adds what a compiled
        # region keeps to replay its draws. (Saved-tensor calls take other forms under
        # compile, which may keep less.)
        assert compiled >= plan.estimated_bytes
    # The compiled estimate bounds what the compiled step keeps.
    assert saved <= compiled + 0.02 * plan.plain_bytes, (saved, compiled, plan)
    assert CheckpointPlan.from_dict(plan.to_dict()).compiled_estimated_bytes == compiled
    assert saved < plain_saved
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


class _Block(nn.Module):
    def forward(self, x: torch.Tensor, flag: bool = False, pair: Any = None) -> torch.Tensor:
        return x.sin() * 2 if flag and pair is not None else x.cos()


def test_a_checkpointed_call_with_bools_and_tuples_traces_in_one_graph() -> None:
    # transformers passes use_cache=False and position_embeddings=(cos, sin); the KV-cache
    # check read type(value).__module__, which dynamo cannot trace for builtins.
    block = checkpoint_wrapper(_Block())
    x = torch.randn(3, requires_grad=True)
    compiled = torch.compile(
        lambda x: block(x, flag=True, pair=(x, x)), backend="aot_eager", fullgraph=True
    )
    compiled(x).sum().backward()
    assert x.grad is not None and torch.allclose(x.grad, 2 * x.detach().cos())


def test_a_cache_object_is_still_refused_under_compile() -> None:
    cache = type("DynamicCache", (), {"__module__": "transformers.cache_utils"})()
    block = checkpoint_wrapper(_Block())
    compiled = torch.compile(lambda x: block(x, pair=cache), backend="aot_eager")
    with pytest.raises(ValueError, match="key-value cache"):
        compiled(torch.randn(3, requires_grad=True))


def test_the_compiled_forms_are_in_the_plan_its_note_and_its_file(tmp_path: Any) -> None:
    case = zoo.build("qwen2")
    plan = plan_checkpointing(copy.deepcopy(case.model), case.inputs, 0.5, rates=SAVED_GRAIN_FREE)
    forms = {saved.compiled_as for saved in plan.saved_plans.values()}
    assert forms and forms <= {FULL, SELECTIVE, KEEP}
    assert "Under torch.compile" in plan.note and "a compiled step is estimated" in plan.note
    plan.save(tmp_path / "plan.json")
    assert CheckpointPlan.load(tmp_path / "plan.json").saved_plans == plan.saved_plans
    # A plan saved before the form was recorded compiles its saved-tensor calls whole.
    value = plan.to_dict()
    for decision in value["decisions"].values():
        if decision["grain"] == SAVED:
            del decision["payload"]["compiled_as"]
    loaded = CheckpointPlan.from_dict(value)
    assert {saved.compiled_as for saved in loaded.saved_plans.values()} == {FULL}


@pytest.mark.skipif(NO_TRANSFORMERS is not None, reason=str(NO_TRANSFORMERS))
def test_a_plan_that_cannot_hold_compiled_says_so() -> None:
    # Tiny GPT-2: packed dropout masks (a bit per element) have no compiled form as
    # small, and each recomputed draw keeps a generator state.
    case = zoo.build("gpt2")
    plan = plan_checkpointing(copy.deepcopy(case.model), case.inputs, 0.25)
    assert "above the plan's estimate" in plan.note, plan.note


def test_a_checkpointed_lstm_runs_outside_the_graph_within_its_estimate_exactly() -> None:
    # Dynamo traces no RNN inside a checkpointed region (and skips a plain model's frame
    # holding one): the wrapper runs it eagerly, with its checkpoint, from the graph.
    case = zoo.build("lstm")
    planned = copy.deepcopy(case.model)
    plan = plan_checkpointing(planned, case.inputs, 0.5)
    plan.apply(planned)
    expected = _compiled_step(Case(case.model, case.inputs, case.loss_of, 0.5), case.model)[2]
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(planned, backend="aot_eager")
    exclude = [*planned.parameters(), *planned.buffers()]
    with SavedTensorMeter(exclude=exclude) as meter:  # the region's hooks: walking would unpack
        torch.manual_seed(7)
        out = compiled(*case.inputs)
    reasons = " ".join(torch._dynamo.utils.counters["graph_break"])
    loss = case.loss_of(out)
    loss.backward()
    grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in planned.parameters()]
    assert "RNN" not in reasons
    assert meter.bytes <= plan.estimated_bytes + 0.02 * plan.plain_bytes
    got = [loss.detach(), *grads, *planned.buffers()]
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


class _Remembering(nn.Module):
    """Keeps its last output's final position, as a recurrent layer keeps its state."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(32, 32)
        self.state: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.linear(x))
        self.state = hidden[:, -1].detach()
        return hidden


def _remembering_case() -> Case:
    torch.manual_seed(0)
    blocks = [
        nn.Sequential(_Remembering(), nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
        for _ in range(4)
    ]
    model = nn.Sequential(*blocks).train()
    x = torch.randn(4, 16, 32, generator=torch.Generator().manual_seed(1))
    return Case(model, (x,), lambda out: out.square().mean(), 0.5)


def test_a_module_that_keeps_a_state_in_forward_is_named_in_the_note() -> None:
    # Dynamo refuses the assignment inside a checkpointed region and breaks the graph;
    # the plan says so, and names torch's setting that lets dynamo trace it.
    case = _remembering_case()
    planned = copy.deepcopy(case.model)
    plan = plan_checkpointing(planned, case.inputs, case.budget)
    assert any(d == FULL for d in plan.decisions.values()), plan
    assert "rebind attributes of their module in forward" in plan.note, plan.note
    assert ": state" in plan.note and "skip_fwd_side_effects_in_bwd_under_checkpoint" in plan.note
    assert not any(
        isinstance(m.state, torch._subclasses.fake_tensor.FakeTensor)
        for m in planned.modules()
        if isinstance(m, _Remembering)
    )
    config = torch._dynamo.config
    if not hasattr(config, "skip_fwd_side_effects_in_bwd_under_checkpoint"):
        pytest.skip("this torch has no skip_fwd_side_effects_in_bwd_under_checkpoint")
    plan.apply(planned)
    with config.patch(skip_fwd_side_effects_in_bwd_under_checkpoint=True):
        breaks, _, expected = _compiled_step(case, case.model)
        torch._dynamo.reset()
        planned_breaks, saved, got = _compiled_step(case, planned)
    assert planned_breaks == breaks
    compiled = plan.compiled_estimated_bytes
    assert compiled is not None and saved <= compiled + 0.02 * plan.plain_bytes, plan
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def test_a_plan_without_such_a_module_says_nothing_of_it() -> None:
    case = _remembering_case()
    for module in case.model.modules():
        if isinstance(module, _Remembering):
            module.forward = types.MethodType(  # type: ignore[method-assign]
                lambda self, x: torch.tanh(self.linear(x)), module
            )
    plan = plan_checkpointing(copy.deepcopy(case.model), case.inputs, case.budget)
    assert "rebind attributes" not in plan.note
