"""checkpointing.integrations: transformers models checkpointing through our checkpoint.

Tiny GPT-2 and Llama models built from configs (no download), dropout on, in training
mode. Our checkpoint and transformers' own (``torch.utils.checkpoint``) both replay the
generator state in the recomputation, so the dropout masks are the same and the losses
and gradients are bit-for-bit equal (``torch.equal``) to each other and to no
checkpointing at all, on CPU. A run with ``preserve_rng_state=False`` shows the
comparison would catch a recomputation that drew other masks.

Skipped as a whole when transformers is not installed (``pip install -e '.[hf]'``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import torch.utils.checkpoint
from torch import nn

import accel
from backends.recording import RecordingBackend
from checkpointing import checkpoint
from checkpointing.integrations import (
    disable_gradient_checkpointing,
    enable_gradient_checkpointing,
)

transformers = pytest.importorskip(
    "transformers",
    reason="transformers is not installed; install the extra: python -m pip install -e '.[hf]'",
)
if not transformers.utils.is_torch_available():
    # transformers 5.x treats a torch older than its floor (2.6) as absent; pip can install
    # such a pair, e.g. on Python 3.10 with torch 2.4, the oldest release we support.
    pytest.skip(
        f"transformers {transformers.__version__} does not support torch {torch.__version__} "
        "(transformers 5 needs torch 2.6 or newer); the integration is tested where "
        "transformers supports the installed torch.",
        allow_module_level=True,
    )

LAYERS = 2
VOCAB = 64


def gpt2() -> nn.Module:
    config = transformers.GPT2Config(
        n_layer=LAYERS,
        n_embd=32,
        n_head=2,
        n_positions=16,
        vocab_size=VOCAB,
        attn_pdrop=0.1,
        resid_pdrop=0.1,
        embd_pdrop=0.1,
        bos_token_id=0,
        eos_token_id=1,
        use_cache=False,
    )
    return transformers.GPT2LMHeadModel(config)


def llama() -> nn.Module:
    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=16,
        attention_dropout=0.1,
        bos_token_id=0,
        eos_token_id=1,
        use_cache=False,
    )
    return transformers.LlamaForCausalLM(config)


MODELS = {"gpt2": gpt2, "llama": llama}
TOKENS = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))


def build(name: str) -> nn.Module:
    torch.manual_seed(0)
    model = MODELS[name]()
    model.train()
    return model


def step(model: nn.Module, seed: int = 7) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One forward and backward from a fixed generator state; the loss and gradients."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss = model(input_ids=TOKENS, labels=TOKENS).loss
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    assert len(grads) == len(list(model.parameters()))
    return loss.detach(), grads


def enable_transformers_own(model: nn.Module, use_reentrant: bool) -> None:
    """transformers' own checkpointing (``activation_checkpointing_enable`` from 5.x)."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is None:
        enable = model.gradient_checkpointing_enable
    enable({"use_reentrant": use_reentrant})


def checkpoint_functions(model: nn.Module) -> list[Any]:
    return [
        vars(module)["_gradient_checkpointing_func"]
        for module in model.modules()
        if "_gradient_checkpointing_func" in vars(module)
    ]


def is_ours(function: Any) -> bool:
    return isinstance(function, functools.partial) and function.func is checkpoint


def checkpointing_is_on(model: nn.Module) -> bool:
    return any(getattr(module, "gradient_checkpointing", False) for module in model.modules())


def assert_bit_equal(
    got: tuple[torch.Tensor, list[torch.Tensor]], expected: tuple[torch.Tensor, list[torch.Tensor]]
) -> None:
    assert torch.equal(got[0], expected[0]), (got[0], expected[0])
    for index, (a, b) in enumerate(zip(got[1], expected[1], strict=True)):
        assert torch.equal(a, b), f"gradient {index} differs by {(a - b).abs().max().item()}"


@pytest.mark.parametrize("use_reentrant", [False, True], ids=["non_reentrant", "reentrant"])
@pytest.mark.parametrize("name", list(MODELS))
def test_same_loss_and_gradients_as_transformers_and_no_checkpointing(
    name: str, use_reentrant: bool
) -> None:
    model = build(name)
    plain = step(model)
    # Dropout is really on: another generator state gives another loss.
    assert not torch.equal(step(model, seed=8)[0], plain[0])

    enable_transformers_own(model, use_reentrant)
    assert all(f.func is torch.utils.checkpoint.checkpoint for f in checkpoint_functions(model))
    theirs = step(model)

    backend = RecordingBackend()
    enable_gradient_checkpointing(model, use_reentrant=use_reentrant, backend=backend)
    functions = checkpoint_functions(model)
    assert len(functions) >= LAYERS and all(is_ours(f) for f in functions)
    assert checkpointing_is_on(model)
    ours = step(model)

    # Our checkpoint ran once per layer, and recomputed each layer once in backward.
    assert backend.count("mark_step") == LAYERS
    assert_bit_equal(ours, theirs)
    assert_bit_equal(ours, plain)


def test_rng_replay_is_what_makes_it_exact() -> None:
    model = build("gpt2")
    plain = step(model)
    enable_gradient_checkpointing(model, preserve_rng_state=False, backend=RecordingBackend())
    loss, grads = step(model)
    # The forward is the same; the recomputation draws other dropout masks.
    assert torch.equal(loss, plain[0])
    assert not all(torch.equal(a, b) for a, b in zip(grads, plain[1], strict=True))


def test_default_backend_and_extra_keywords(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEL", "recording")
    entered: list[str] = []

    @contextmanager
    def mark(label: str) -> Iterator[None]:
        entered.append(label)
        yield

    def context_fn() -> tuple[Any, Any]:
        return mark("forward"), mark("recompute")

    model = build("gpt2")
    plain = step(model)
    enable_gradient_checkpointing(model, context_fn=context_fn)
    ours = step(model)

    assert entered == ["forward"] * LAYERS + ["recompute"] * LAYERS
    backend = accel.get_backend()
    assert backend.name == "recording"
    assert backend.count("mark_step") == LAYERS  # type: ignore[attr-defined]
    assert_bit_equal(ours, plain)


@pytest.mark.parametrize("disable", ["ours", "transformers"])
def test_disabling(disable: str) -> None:
    model = build("gpt2")
    backend = RecordingBackend()
    enable_gradient_checkpointing(model, backend=backend)
    step(model)
    assert backend.count("mark_step") == LAYERS

    if disable == "ours":
        disable_gradient_checkpointing(model)
    else:
        getattr(model, "activation_checkpointing_disable", model.gradient_checkpointing_disable)()
    backend.clear()
    step(model)

    assert not checkpointing_is_on(model)
    assert backend.calls == []


def test_eval_mode_does_not_checkpoint() -> None:
    model = build("gpt2")
    backend = RecordingBackend()
    enable_gradient_checkpointing(model, backend=backend)
    model.eval()
    model(input_ids=TOKENS, labels=TOKENS).loss.backward()
    assert backend.calls == []


def test_transformers_own_enable_brings_torch_back() -> None:
    model = build("gpt2")
    enable_gradient_checkpointing(model, backend=RecordingBackend())
    enable_transformers_own(model, use_reentrant=False)
    functions = checkpoint_functions(model)
    assert functions and not any(is_ours(f) for f in functions)


def test_nothing_global_is_patched() -> None:
    torch_checkpoint = torch.utils.checkpoint.checkpoint
    modeling_utils = transformers.modeling_utils
    transformers_checkpoint = getattr(modeling_utils, "checkpoint", None)
    ours, theirs = build("gpt2"), build("gpt2")

    enable_gradient_checkpointing(ours, backend=RecordingBackend())
    enable_transformers_own(theirs, use_reentrant=False)

    assert torch.utils.checkpoint.checkpoint is torch_checkpoint
    assert getattr(modeling_utils, "checkpoint", None) is transformers_checkpoint
    functions = checkpoint_functions(theirs)
    assert functions and all(f.func is torch_checkpoint for f in functions)


def test_not_a_transformers_model() -> None:
    with pytest.raises(TypeError) as caught:
        enable_gradient_checkpointing(nn.Linear(2, 2))
    message = str(caught.value)
    assert message.startswith("checkpointing.integrations: Linear has no")
    assert "apply_activation_checkpointing" in message


class OldFormatModel(nn.Module):
    """Stands in for a model written for transformers < 4.35: no _gradient_checkpointing_func."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 2)
        self.calls: list[str] = []

    def gradient_checkpointing_enable(self, kwargs: dict[str, Any] | None = None) -> None:
        self.calls.append("enable")
        self.layer.gradient_checkpointing = True  # type: ignore[assignment]

    def gradient_checkpointing_disable(self) -> None:
        self.calls.append("disable")
        self.layer.gradient_checkpointing = False  # type: ignore[assignment]


def test_old_format_model_is_refused_and_left_off() -> None:
    model = OldFormatModel()
    with pytest.raises(TypeError, match=r"calls torch\.utils\.checkpoint itself"):
        enable_gradient_checkpointing(model)
    assert model.calls == ["enable", "disable"]
    assert not checkpointing_is_on(model)


def test_unsupported_model_raises_transformers_error() -> None:
    class NoCheckpointing(transformers.GPT2LMHeadModel):  # type: ignore[misc]
        supports_gradient_checkpointing = False

    model = NoCheckpointing(gpt2().config)
    with pytest.raises(ValueError, match="does not support"):
        enable_gradient_checkpointing(model)
    assert not checkpoint_functions(model)
