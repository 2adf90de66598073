"""Acceptance: a GPT-2-shaped model with tied embedding and head, trained with offload.

The model trains three steps under ``offload_parameters`` and :class:`offload.Engine`
(gradient clipping, an LR scheduler, dynamic loss scaling) with every copy forced on,
and must reach the plain loop's parameters; its checkpoint then loads into a plain model
that continues training exactly as the plain run does. Dropout is on. The computation
is the same as the plain loop's (power-of-two loss scales are exact), so the results
are expected bit for bit; they are asserted to rtol=1e-6, atol=1e-7 so that a BLAS that
reorders a reduction between runs cannot make the test flaky.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from offload import Engine, ParameterOffload, offload_parameters
from offload._core import transfer

VOCAB, WIDTH, HEADS, LAYERS, CONTEXT = 48, 32, 4, 3, 12
TOLERANCE = {"rtol": 1e-6, "atol": 1e-7}
MAX_NORM = 0.5


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, HEADS, -1).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        causal = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)
        weights = self.drop(scores.masked_fill(causal, float("-inf")).softmax(-1))
        return self.proj((weights @ v).transpose(1, 2).reshape(batch, length, WIDTH))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attn = Attention()
        self.mlp = nn.Sequential(
            nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH), nn.Dropout(0.1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2's layout: token and position embeddings, pre-norm blocks, tied output head."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.wpe = nn.Embedding(CONTEXT, WIDTH)
        self.drop = nn.Dropout(0.1)
        self.h = nn.ModuleList([Block() for _ in range(LAYERS)])
        self.ln_f = nn.LayerNorm(WIDTH)
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.drop(self.wte(tokens) + self.wpe(positions))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))  # type: ignore[no-any-return]


def hand_built(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return GPT()


def from_transformers(seed: int) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    if not transformers.utils.is_torch_available():
        # transformers without a torch it supports offers configurations only.
        pytest.skip(
            f"transformers {transformers.__version__} does not support torch {torch.__version__}"
        )
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=VOCAB, n_positions=CONTEXT, n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS
    )
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config)
    assert model.lm_head.weight is model.transformer.wte.weight
    return _LogitsOnly(model)


class _LogitsOnly(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=tokens, use_cache=False).logits  # type: ignore[no-any-return]


def data(step: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (4, CONTEXT), generator=torch.Generator().manual_seed(step))


def lm_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def optimizer_for(model: nn.Module) -> tuple[torch.optim.Optimizer, Any]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    return optimizer, scheduler


def plain_steps(
    model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, steps: range
) -> None:
    for step in steps:
        torch.manual_seed(100 + step)  # dropout masks
        tokens = data(step)
        lm_loss(model(tokens), tokens).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()


def assert_same(actual: nn.Module, expected: nn.Module) -> None:
    pairs = zip(actual.state_dict().items(), expected.state_dict().items(), strict=True)
    for (name, a), (other, e) in pairs:
        assert name == other
        torch.testing.assert_close(a, e, **TOLERANCE, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("build", [hand_built, from_transformers], ids=["by-hand", "transformers"])
def test_gpt2_trains_offloaded_saves_and_continues_plain(
    monkeypatch: pytest.MonkeyPatch, build: Callable[[int], nn.Module]
) -> None:
    plain = build(0)
    plain_optimizer, plain_scheduler = optimizer_for(plain)
    plain_steps(plain, plain_optimizer, plain_scheduler, range(3))

    monkeypatch.setattr(transfer, "copies_needed", lambda device, home: True)
    model = build(0)
    offload_parameters(model)  # the handle is not kept: offloading stays in force
    optimizer, scheduler = optimizer_for(model)
    engine = Engine(
        model,
        optimizer,
        loss_scale="dynamic",
        gradient_clipping=MAX_NORM,
        lr_scheduler=scheduler,
    )
    for step in range(3):
        torch.manual_seed(100 + step)
        tokens = data(step)
        engine.backward(lm_loss(engine(tokens), tokens))
        assert engine.step()
    handle = ParameterOffload.of(model)
    assert handle is not None and handle.is_home() and handle.max_resident >= 1
    assert any(name.startswith("parameters shared by") for name in handle.states)
    assert engine.skipped_steps == 0 and engine.grad_norm is not None
    assert_same(model, plain)

    buffer = io.BytesIO()
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
        },
        buffer,
    )
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    monkeypatch.undo()
    resumed = build(1)  # other initial weights: everything must come from the checkpoint
    resumed.load_state_dict(saved["model"])
    resumed_optimizer, resumed_scheduler = optimizer_for(resumed)
    resumed_optimizer.load_state_dict(saved["optimizer"])
    resumed_scheduler.load_state_dict(saved["scheduler"])
    plain_steps(resumed, resumed_optimizer, resumed_scheduler, range(3, 5))
    plain_steps(plain, plain_optimizer, plain_scheduler, range(3, 5))
    assert_same(resumed, plain)
