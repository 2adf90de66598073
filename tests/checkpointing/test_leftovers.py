"""Planning leaves nothing behind: a model whose code caches a tensor it computes in forward.

Each model below keeps a relative-position index, computed in ``forward`` from the
sequence length, in one kind of cache: an ``lru_cache`` on a module-level function or
on a method (keyed by ``self`` or not), a class-level dict, a module-level dict, a
global, a closure variable, a class attribute, an instance attribute. The index picks
a learned bias per query-key distance (``aten.index``), as BEiT's relative position
bias does. Planning runs the model's code on fake tensors, so each cache would keep a
fake index, and the next real step, of this model or of any other instance of its
class, would fail. Each test plans at 0.5, applies the plan, trains one step exactly
like the plain model, and then runs a real step of a second instance never planned.
"""

from __future__ import annotations

import copy
import functools
import gc
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from accel._compat import fake_profile_unavailable
from checkpointing import plan_checkpointing
from checkpointing.planner._leftovers import leaving_nothing, tracking

WIDTH, SEQ, BATCH, BLOCKS = 16, 8, 2, 4


def _relative_index(length: int) -> torch.Tensor:
    positions = torch.arange(length)
    return (positions[:, None] - positions[None, :] + length - 1).flatten()


@functools.lru_cache(maxsize=4)
def _lru_index(length: int) -> torch.Tensor:
    return _relative_index(length)


_MODULE_CACHE: dict[int, tuple[torch.Tensor, int]] = {}
_GLOBAL_INDEX: torch.Tensor | None = None


def _module_dict_index(length: int) -> torch.Tensor:
    if length not in _MODULE_CACHE:  # a tuple holds the tensor: the walk climbs past it
        _MODULE_CACHE[length] = (_relative_index(length), length)
    return _MODULE_CACHE[length][0]


def _global_index(length: int) -> torch.Tensor:
    global _GLOBAL_INDEX
    if _GLOBAL_INDEX is None or _GLOBAL_INDEX.numel() != length * length:
        _GLOBAL_INDEX = _relative_index(length)
    return _GLOBAL_INDEX


def _closure() -> Callable[[int], torch.Tensor]:
    cached: torch.Tensor | None = None

    def index(length: int) -> torch.Tensor:
        nonlocal cached
        if cached is None or cached.numel() != length * length:
            cached = _relative_index(length)
        return cached

    return index


_closure_index = _closure()


def _cached_wrapper(function: Callable[..., Any]) -> Callable[..., Any]:
    """An ``lru_cache`` inside a wrapper's closure, as transformers' BEiT has it."""
    cached = functools.lru_cache(maxsize=4)(function)

    @functools.wraps(function)
    def wrapper(*args: Any) -> Any:
        return cached(*args)

    return wrapper


class Block(nn.Module):
    """Attention over the sequence with a learned bias per query-key distance."""

    shared: ClassVar[dict[int, torch.Tensor]] = {}  # a class-level dict cache
    class_index: ClassVar[torch.Tensor | None] = None  # a class attribute set in forward

    def __init__(self, cache: str) -> None:
        super().__init__()
        self.cache = cache
        self.bias = nn.Parameter(torch.randn(2 * SEQ - 1) * 0.1)
        self.mix = nn.Linear(WIDTH, WIDTH)
        self.instance_index: torch.Tensor | None = None

    @staticmethod
    @_cached_wrapper
    def static_index(length: int) -> torch.Tensor:
        return _relative_index(length)

    @functools.lru_cache(maxsize=4)  # noqa: B019 (the cache under test)
    def method_index(self, length: int) -> torch.Tensor:
        return _relative_index(length)

    def index(self, length: int) -> torch.Tensor:
        if self.cache == "class dict":
            if length not in Block.shared:
                Block.shared[length] = _relative_index(length)
            return Block.shared[length]
        if self.cache == "class attribute":
            index = type(self).class_index
            if index is None or index.numel() != length * length:
                type(self).class_index = index = _relative_index(length)
            return index
        if self.cache == "instance attribute":
            if self.instance_index is None:
                self.instance_index = _relative_index(length)
            return self.instance_index
        if self.cache == "static lru_cache in a closure":
            return self.static_index(length)
        if self.cache == "method lru_cache":
            return self.method_index(length)
        functions = {
            "module lru_cache": _lru_index,
            "module dict": _module_dict_index,
            "global": _global_index,
            "closure": _closure_index,
        }
        return functions[self.cache](length)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[1]
        bias = self.bias[self.index(length)].view(length, length)
        scores = torch.softmax(x @ x.transpose(1, 2) / WIDTH**0.5 + bias, dim=-1)
        return x + torch.tanh(self.mix(scores @ x))


class Model(nn.Module):
    def __init__(self, cache: str) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(Block(cache) for _ in range(BLOCKS)))
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


CACHES = [
    "module lru_cache",
    "static lru_cache in a closure",
    "method lru_cache",
    "class dict",
    "class attribute",
    "module dict",
    "global",
    "closure",
    "instance attribute",
]


def _step(model: nn.Module, inputs: dict[str, torch.Tensor] | tuple[torch.Tensor, ...]) -> Any:
    torch.manual_seed(3)
    output = model(**inputs) if isinstance(inputs, dict) else model(*inputs)
    logits = output if isinstance(output, torch.Tensor) else output.logits
    loss = logits.float().square().mean()
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()]


def _plan_train_and_run_another(
    build: Callable[[], nn.Module], inputs: dict[str, torch.Tensor] | tuple[torch.Tensor, ...]
) -> None:
    torch.manual_seed(0)
    model = build().train()
    reference = copy.deepcopy(model)
    plan = plan_checkpointing(model, inputs, memory_budget=0.5)
    if fake_profile_unavailable() is None:
        assert "Profiled on real tensors" not in plan.note  # the fake profile ran
    plan.apply(model)
    loss, grads = _step(model, inputs)
    expected_loss, expected_grads = _step(reference, inputs)
    assert torch.equal(loss, expected_loss)
    for grad, expected in zip(grads, expected_grads, strict=True):
        assert (grad is None and expected is None) or torch.equal(grad, expected)
    _step(build().train(), inputs)  # another instance, never planned


def _reset_caches() -> None:
    global _GLOBAL_INDEX
    _lru_index.cache_clear()
    _MODULE_CACHE.clear()
    Block.shared.clear()
    Block.class_index = None
    _GLOBAL_INDEX = None


@pytest.mark.parametrize("cache", CACHES)
def test_a_tensor_cached_in_forward_is_not_left_fake(cache: str) -> None:
    _reset_caches()
    x = torch.randn(BATCH, SEQ, WIDTH, generator=torch.Generator().manual_seed(1))
    _plan_train_and_run_another(lambda: Model(cache), (x,))


@pytest.mark.parametrize("cache", ["module lru_cache", "class dict", "instance attribute"])
def test_a_cache_a_real_step_filled_is_used_and_kept(cache: str) -> None:
    # Planning after a real step (or a second time): the fake step reads the real index
    # the cache holds (as a constant), and leaves it there.
    _reset_caches()
    x = torch.randn(BATCH, SEQ, WIDTH, generator=torch.Generator().manual_seed(1))

    def warmed() -> nn.Module:
        model = Model(cache)
        model(x).sum().backward()
        model.zero_grad(set_to_none=True)
        return model

    _plan_train_and_run_another(warmed, (x,))
    assert not isinstance(Block.shared.get(SEQ, torch.empty(0)), FakeTensor)


class _Remembers(nn.Module):
    """Keeps its last forward's mask as an attribute, after an LSTM (a real-tensor profile)."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(WIDTH, WIDTH, batch_first=True)
        self.head = nn.Linear(WIDTH, 1)
        self.last_mask: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.rnn(x)[0]
        self.last_mask = hidden > 0
        return self.head(hidden * self.last_mask)


def test_the_real_tensor_profile_sets_the_models_attributes_back() -> None:
    x = torch.randn(BATCH, SEQ, WIDTH, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    model = _Remembers().train()
    plan = plan_checkpointing(model, (x,), memory_budget=0.5)
    assert "Profiled on real tensors" in plan.note  # the LSTM has no fake workspace size
    assert model.last_mask is None


class _TwoPaths(nn.Module):
    """One layer registered at two paths (inside a stage and on the model) and a head
    tied to the embedding: each swapped in once, each tied tensor under both names."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(SEQ, WIDTH)
        self.layer = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh())
        self.stage = nn.Sequential(nn.Linear(WIDTH, WIDTH), self.layer)
        self.head = nn.Linear(WIDTH, SEQ, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer(self.stage(self.embed(ids))))


def test_a_module_at_two_paths_and_a_tied_weight_are_not_left_fake() -> None:
    ids = torch.randint(SEQ, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    model = _TwoPaths().train()
    reference = copy.deepcopy(model)
    plan = plan_checkpointing(model, (ids,), memory_budget=0.8)
    tensors = [*model.parameters(), *model.buffers()]
    assert not any(isinstance(t, FakeTensor) or isinstance(t.grad, FakeTensor) for t in tensors)
    assert model.head.weight is model.embed.weight
    plan.apply(model)
    for net in (model, reference):
        torch.manual_seed(7)
        net(ids).square().mean().backward()
    pairs = zip(model.parameters(), reference.parameters(), strict=True)
    assert all(torch.equal(a.grad, b.grad) for a, b in pairs)  # type: ignore[arg-type]


class _ReversibleFunction(torch.autograd.Function):
    """Runs ``layer`` without a graph and, in backward, again with one (as Reformer's
    reversible layers do): the recomputed graph's backward accumulates into the layer's
    parameters' ``.grad`` directly."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
        ctx.layer = layer
        ctx.save_for_backward(x)
        with torch.no_grad():
            return x + layer(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            torch.autograd.backward(x + ctx.layer(x), grad)
        assert x.grad is not None
        return x.grad, None


class _Reversible(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(WIDTH, WIDTH)
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(), nn.Linear(2 * WIDTH, WIDTH))
            for _ in range(BLOCKS)
        )
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(x)
        for layer in self.layers:
            hidden = _ReversibleFunction.apply(hidden, layer)
        return self.head(torch.tanh(hidden))


def test_gradients_a_models_own_backward_writes_while_planning_are_put_back() -> None:
    x = torch.randn(BATCH, SEQ, WIDTH, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    model = _Reversible().train()
    reference = copy.deepcopy(model)
    model.head.bias.grad = kept = torch.ones(1)  # a gradient from before: kept as it is
    plan = plan_checkpointing(model, (x,), memory_budget=0.5)
    assert model.head.bias.grad is kept
    others = [p for name, p in model.named_parameters() if name != "head.bias"]
    assert all(p.grad is None for p in others), [type(p.grad) for p in others]
    model.head.bias.grad = None
    plan.apply(model)
    for net in (model, reference):
        net(x).square().mean().backward()
    pairs = zip(model.parameters(), reference.parameters(), strict=True)
    assert all(torch.equal(a.grad, b.grad) for a, b in pairs)  # type: ignore[arg-type]


class _Routed(nn.Module):
    """Picks rows by their values (``nonzero``): a shape fake tensors cannot know."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(nn.Linear(WIDTH, WIDTH) for _ in range(BLOCKS)))
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.blocks(x)).exp()  # exp saves its output for backward
        picked = hidden[hidden[..., 0] > 1]
        return self.head(picked).sum() + hidden.sum()


def _live_fakes() -> int:
    gc.collect()
    return sum(type(obj) is FakeTensor for obj in gc.get_referrers(FakeTensor))


def test_a_step_that_fails_on_fake_tensors_leaves_none_alive() -> None:
    # Its graph was tied to the tensors it saved, so the collector could not free it.
    x = torch.randn(BATCH, SEQ, WIDTH, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    before = _live_fakes()
    plan = plan_checkpointing(_Routed().train(), (x,), memory_budget=0.5)
    if fake_profile_unavailable() is None:
        assert "could not run on fake tensors" in plan.note
    # At most as many as before: fakes an earlier test left to the collector may go too.
    assert _live_fakes() <= before


def test_only_what_the_step_left_outside_it_is_removed() -> None:
    _reset_caches()
    real = _lru_index(SEQ)
    Block.shared[SEQ] = real
    with leaving_nothing(nn.Linear(1, 1)), FakeTensorMode(), tracking():
        local = torch.ones(2)  # held by this frame only
        _MODULE_CACHE[7] = (torch.zeros(3), 7)  # left in a cache
        assert _lru_index(SEQ) is real  # a real tensor cached before
    assert 7 not in _MODULE_CACHE
    assert _lru_index(SEQ) is real and Block.shared[SEQ] is real
    assert local.shape == (2,)


def test_transformers_beit_relative_position_bias() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.BeitConfig(
        image_size=16,
        patch_size=8,
        num_hidden_layers=2,
        hidden_size=16,
        num_attention_heads=2,
        intermediate_size=32,
        use_relative_position_bias=True,
        num_labels=2,
    )
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    _plan_train_and_run_another(
        lambda: transformers.BeitForImageClassification(config), {"pixel_values": pixels}
    )
