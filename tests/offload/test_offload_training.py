"""Offload in real training loops: tied weights, gradients the user owns, hooks that compose.

Every test runs with every copy forced on (the path accelerators take) and, where the
difference matters, without copies too. Comparisons without micro-batches are bit-exact.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch
from torch import nn

from accel import _compat
from offload import OffloadModel, ParameterOffload, offload_parameters


class Tied(nn.Module):
    """An embedding shared with the output projection, as in GPT-2."""

    def __init__(self, vocab: int = 11, width: int = 8, tie: bool = True) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.body = nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width))
        self.head = nn.Linear(width, vocab, bias=False)
        if tie:
            self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(tokens)))


def tied(seed: int = 0) -> Tied:
    torch.manual_seed(seed)
    return Tied()


def untied(seed: int = 0) -> Tied:
    torch.manual_seed(seed)
    return Tied(tie=False)


def tokens(step: int) -> torch.Tensor:
    return torch.randint(0, 11, (4, 5), generator=torch.Generator().manual_seed(step))


def train(model: nn.Module, steps: int = 3) -> list[list[torch.Tensor]]:
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    grads = []
    for step in range(steps):
        model(tokens(step)).logsumexp(-1).mean().backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
        optimizer.step()
        optimizer.zero_grad()
    return grads


def assert_equal(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        assert a.device == e.device and torch.equal(a, e), (a - e).abs().max()


# 1. Tied weights -------------------------------------------------------------------------


def test_tied_weights_train_like_the_plain_model(copy_mode: bool) -> None:
    expected_model = tied()
    expected = train(expected_model)
    model = tied()
    handle = offload_parameters(model)
    assert model.head.weight is model.embed.weight
    actual = train(model)
    for step_actual, step_expected in zip(actual, expected, strict=True):
        assert_equal(step_actual, step_expected)
    assert_equal(list(model.parameters()), list(expected_model.parameters()))
    assert handle.is_home()
    handle.remove()
    assert model.head.weight is model.embed.weight


def test_a_module_whose_weight_is_shared_loads_it_when_it_runs(copies: None) -> None:
    model = tied()
    handle = offload_parameters(model, prefetch=0)
    seen: list[tuple[str, ...]] = []
    model.head.register_forward_pre_hook(lambda m, a: seen.append(handle.resident_modules))
    model(tokens(0)).sum().backward()
    assert any("shared" in name for name in seen[0])
    assert handle.is_home() and handle.state.name == "IDLE"
    handle.remove()


# 2. Gradients belong to the user ---------------------------------------------------------


def _offloaded(wrapper: str) -> tuple[nn.Sequential, nn.Module, list[ParameterOffload]]:
    """Three layers offloaded by ``wrapper``: the layers, what to call, the handles."""
    torch.manual_seed(0)
    layers = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    if wrapper == "offload_parameters":
        return layers, layers, [offload_parameters(layers)]
    return layers, OffloadModel(layers, num_slices=2), []


@pytest.mark.parametrize("wrapper", ["offload_parameters", "OffloadModel"])
def test_a_kept_gradient_is_never_rewritten(copies: None, wrapper: str) -> None:
    layers, model, handles = _offloaded(wrapper)
    first = layers[0].weight
    model(torch.randn(3, 4)).sum().backward()
    kept = first.grad
    assert kept is not None
    snapshot = kept.clone()
    first.grad = None  # what zero_grad(set_to_none=True) does
    model(torch.randn(3, 4) * 5).sum().backward()
    assert first.grad is not None and first.grad is not kept
    assert torch.equal(kept, snapshot), "a gradient handed out in step 1 changed in step 2"
    # Without set_to_none, the gradient accumulates into the tensor the user holds.
    held = first.grad
    model(torch.randn(3, 4)).sum().backward()
    assert first.grad is held
    assert all(handle.is_home() for handle in handles)


# 3. The user's saved-tensor hooks --------------------------------------------------------


@pytest.mark.skipif(
    not _compat.SAVED_TENSORS_HOOKS_VISIBLE,
    reason="torch 2.4 cannot report the active saved-tensor hooks to Python",
)
def test_the_users_saved_tensor_hooks_still_see_the_activations(copies: None) -> None:
    def count_packs(model: nn.Module, parameters: list[nn.Parameter]) -> tuple[int, Any]:
        counted = []

        def pack(tensor: torch.Tensor) -> Any:
            own = {p.untyped_storage().data_ptr() for p in parameters}
            if tensor.untyped_storage().data_ptr() not in own:
                counted.append(tensor.shape)
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(tokens(1))
        out.square().mean().backward()
        return len(counted), [p.grad for p in parameters]

    plain = untied()
    expected, expected_grads = count_packs(plain, list(plain.parameters()))
    model = untied()
    handle = offload_parameters(model)
    actual, grads = count_packs(model, list(model.parameters()))
    assert expected > 0 and actual == expected
    assert_equal(grads, expected_grads)
    handle.remove()


# 4. A dropped handle -----------------------------------------------------------------------


def test_offloading_stays_in_force_without_the_handle(copies: None) -> None:
    expected = train(untied())
    model = untied()
    offload_parameters(model)  # used as a statement, like apply_activation_checkpointing
    gc.collect()
    handle = ParameterOffload.of(model)
    assert handle is not None and ParameterOffload.of(nn.Linear(1, 1)) is None
    actual = train(model)
    for step_actual, step_expected in zip(actual, expected, strict=True):
        assert_equal(step_actual, step_expected)
    assert handle.max_resident >= 1 and handle.is_home()
    handle.remove()
    assert ParameterOffload.of(model) is None


# 8. The autocast cache ---------------------------------------------------------------------


def _changed_in_place(model: nn.Module) -> torch.Tensor:
    """Run under one autocast region, change the weights on the host, run again."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.randn(3, 4))
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.mul_(-1.5)
        again: torch.Tensor = model(torch.ones(3, 4))
    return again


@pytest.mark.parametrize("wrapper", ["offload_parameters", "OffloadModel"])
def test_the_autocast_cache_keeps_no_cast_of_offloaded_weights(copies: None, wrapper: str) -> None:
    _, model, _ = _offloaded(wrapper)
    again = _changed_in_place(model)
    assert torch.is_autocast_cache_enabled()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fresh = model(torch.ones(3, 4))
    # A cached cast would still hold the weights of the first call.
    assert torch.equal(again, fresh)


# OffloadModel: tied weights across slices, micro-batched keywords --------------------------


class Embed(nn.Module):
    def __init__(self, embedding: nn.Embedding) -> None:
        super().__init__()
        self.embedding = embedding

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embedding(tokens)


def sequential_tied(seed: int = 0) -> nn.Sequential:
    model = tied(seed)
    return nn.Sequential(Embed(model.embed), *model.body, model.head)


@pytest.mark.parametrize("checkpoint_activation", [False, True], ids=["plain", "ckpt"])
@pytest.mark.parametrize("num_slices", [2, 3, 5])
def test_offload_model_trains_tied_weights_across_slices(
    copy_mode: bool, num_slices: int, checkpoint_activation: bool
) -> None:
    expected_model = sequential_tied()
    expected = train(expected_model)
    layers = sequential_tied()
    model = OffloadModel(layers, num_slices=num_slices, checkpoint_activation=checkpoint_activation)
    actual = train(model)
    for step_actual, step_expected in zip(actual, expected, strict=True):
        assert_equal(step_actual, step_expected)
    assert_equal(list(model.parameters()), list(expected_model.parameters()))
    assert layers[-1].weight is layers[0].embedding.weight
    assert model.is_home() and model.max_resident_slices <= 2


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(5, 5)

    def forward(self, x: torch.Tensor, *, scale: torch.Tensor) -> torch.Tensor:
        return self.proj(x) * scale  # scale: one value per feature


def test_only_marked_keywords_are_split_into_micro_batches(copy_mode: bool) -> None:
    torch.manual_seed(0)
    layers = [Scaled(), Scaled()]
    x, scale = torch.randn(5, 5), torch.linspace(0.5, 1.5, 5)  # 5 samples, 5 features
    expected = layers[1](layers[0](x, scale=scale), scale=scale)
    model = OffloadModel(layers, num_slices=2, num_microbatches=2)
    torch.testing.assert_close(model(x, scale=scale), expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(Exception, match="batched_kwargs must be a sequence of keyword names"):
        OffloadModel([Scaled()], batched_kwargs="scale")
