"""The zoo's newer families (see ``_zoo.py``): module shapes the first six do not have.

Each builder returns ``(model, inputs, loss_of, block_types)`` for ``_zoo.build``, seeded
by the caller; ``bench`` selects the benchmark's shapes (else the tests' small ones).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = [
    "LSTMLanguageModel",
    "MixerLayer",
    "MixerStack",
    "build",
    "next_token_loss",
    "token_ids",
]

Built = tuple[nn.Module, Any, Callable[[Any], torch.Tensor], tuple[type[nn.Module], ...]]


class LSTMLanguageModel(nn.Module):
    """Embedding, a 2-layer LSTM with dropout between its layers, a linear head."""

    def __init__(self, vocab: int, width: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.lstm = nn.LSTM(width, width, num_layers=2, dropout=0.1, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.lstm(self.embed(ids))
        return self.head(hidden)


class MixerLayer(nn.Module):
    """A user's own layer without children: its parameters, functional operators, dropout."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(width))
        self.up = nn.Parameter(torch.randn(4 * width, width) / width**0.5)
        self.down = nn.Parameter(torch.randn(width, 4 * width) / (4 * width) ** 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = nn.functional.layer_norm(x, x.shape[-1:], self.scale)
        hidden = nn.functional.gelu(nn.functional.linear(hidden, self.up))
        hidden = nn.functional.dropout(hidden, 0.1, self.training)
        return x + nn.functional.linear(hidden, self.down)


class MixerStack(nn.Module):
    """Childless :class:`MixerLayer` blocks; the root's forward pools and scores itself."""

    def __init__(self, width: int, layers: int, classes: int = 10) -> None:
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.layers = nn.ModuleList(MixerLayer(width) for _ in range(layers))
        self.classes = nn.Parameter(torch.randn(classes, width) / width**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.inp(x)
        for layer in self.layers:
            hidden = layer(hidden)
        # The root's own operators: they save activations outside every submodule.
        pooled = torch.tanh(hidden).mean(dim=1)
        return nn.functional.linear(pooled, self.classes)


def token_ids(vocab: int, batch: int, seq: int, generator: torch.Generator) -> torch.Tensor:
    """Random token ids, ``(batch, seq)``."""
    return torch.randint(vocab, (batch, seq), generator=generator)


def next_token_loss(ids: torch.Tensor) -> Callable[[Any], torch.Tensor]:
    """Cross-entropy of a model's logits (a tensor, or an output's ``.logits``) to ``ids``."""

    def loss(out: Any) -> torch.Tensor:
        logits = out if isinstance(out, torch.Tensor) else out.logits
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids.reshape(-1))

    return loss


def _lstm(bench: bool, generator: torch.Generator, use_cache: bool) -> Built:
    width, seq, batch = (256, 128, 4) if bench else (32, 16, 2)
    model = LSTMLanguageModel(512, width)
    ids = token_ids(512, batch, seq, generator)
    return model, (ids,), next_token_loss(ids), (nn.LSTM,)


def _custom(bench: bool, generator: torch.Generator, use_cache: bool) -> Built:
    width, layers, seq, batch = (256, 4, 128, 4) if bench else (32, 2, 16, 2)
    model = MixerStack(width, layers)
    x = torch.randn(batch, seq, width, generator=generator)
    labels = torch.randint(10, (batch,), generator=generator)
    return model, (x,), lambda out: nn.functional.cross_entropy(out, labels), (MixerLayer,)


def _bert(bench: bool, generator: torch.Generator, use_cache: bool) -> Built:
    from transformers import BertConfig, BertForMaskedLM
    from transformers.models.bert.modeling_bert import BertLayer

    width, layers, seq, batch = (256, 4, 128, 4) if bench else (32, 2, 16, 2)
    config = BertConfig(
        vocab_size=512,
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=4 * width,
        max_position_embeddings=2 * seq,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        use_cache=use_cache,
    )
    model = BertForMaskedLM(config)
    ids = token_ids(config.vocab_size, batch, seq, generator)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[1:, seq - seq // 4 :] = 0  # padding at the end of every row but the first
    labels = torch.where(torch.rand(batch, seq, generator=generator) < 0.15, ids, -100)
    labels[0, 0] = ids[0, 0]  # at least one masked position
    inputs = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    return model, inputs, lambda out: out.loss, (BertLayer,)


def _convnext(bench: bool, generator: torch.Generator, use_cache: bool) -> Built:
    from transformers import ConvNextConfig, ConvNextForImageClassification
    from transformers.models.convnext.modeling_convnext import ConvNextLayer

    sizes, depths, side, batch = (
        ([32, 64, 128], [2, 2, 2], 64, 8) if bench else ([8, 16], [1, 1], 16, 2)
    )
    config = ConvNextConfig(
        num_channels=3,
        hidden_sizes=sizes,
        depths=depths,
        num_stages=len(sizes),
        patch_size=2,
        image_size=side,
        drop_path_rate=0.1,
        num_labels=10,
    )
    model = ConvNextForImageClassification(config)
    images = torch.randn(batch, 3, side, side, generator=generator)
    labels = torch.randint(10, (batch,), generator=generator)
    return (
        model,
        (images,),
        lambda out: nn.functional.cross_entropy(out.logits, labels),
        (ConvNextLayer,),
    )


def _whisper(bench: bool, generator: torch.Generator, use_cache: bool) -> Built:
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    from transformers.models.whisper.modeling_whisper import (
        WhisperDecoderLayer,
        WhisperEncoderLayer,
    )

    width, layers, frames, tokens, batch = (256, 2, 256, 64, 4) if bench else (32, 1, 32, 8, 2)
    config = WhisperConfig(
        vocab_size=512,
        num_mel_bins=16 if not bench else 80,
        d_model=width,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=4 * width,
        decoder_ffn_dim=4 * width,
        max_source_positions=frames // 2,
        max_target_positions=2 * tokens,
        dropout=0.1,
        attention_dropout=0.1,
        decoder_start_token_id=0,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
        suppress_tokens=None,
        begin_suppress_tokens=None,
        use_cache=use_cache,
    )
    model = WhisperForConditionalGeneration(config)
    features = torch.randn(batch, config.num_mel_bins, frames, generator=generator)
    labels = token_ids(config.vocab_size, batch, tokens, generator)
    inputs = {"input_features": features, "labels": labels}
    return model, inputs, lambda out: out.loss, (WhisperEncoderLayer, WhisperDecoderLayer)


def _unet(bench: bool, generator: torch.Generator, use_cache: bool) -> Built:
    from diffusers import UNet2DModel
    from diffusers.models.resnet import ResnetBlock2D

    channels, side, batch = ((32, 64), 32, 8) if bench else ((8, 16), 8, 2)
    model = UNet2DModel(
        sample_size=side,
        in_channels=3,
        out_channels=3,
        block_out_channels=channels,
        layers_per_block=1,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=4,
        attention_head_dim=8,
        dropout=0.1,
    )
    noisy = torch.randn(batch, 3, side, side, generator=generator)
    noise = torch.randn(batch, 3, side, side, generator=generator)
    steps = torch.randint(1000, (batch,), generator=generator)
    return (
        model,
        (noisy, steps),
        lambda out: nn.functional.mse_loss(out.sample, noise),
        (ResnetBlock2D,),
    )


def _phi(bench: bool, generator: torch.Generator, use_cache: bool) -> Built:
    from transformers import PhiConfig, PhiForCausalLM
    from transformers.models.phi.modeling_phi import PhiDecoderLayer

    width, layers, seq, batch = (256, 4, 128, 4) if bench else (32, 2, 16, 2)
    config = PhiConfig(
        vocab_size=512,
        hidden_size=width,
        intermediate_size=4 * width,
        num_hidden_layers=layers,
        num_attention_heads=4,
        max_position_embeddings=2 * seq,
        partial_rotary_factor=0.5,
        resid_pdrop=0.1,
        embd_pdrop=0.1,
        attention_dropout=0.1,
        use_cache=use_cache,
    )
    model = PhiForCausalLM(config)
    ids = token_ids(config.vocab_size, batch, seq, generator)
    return model, (ids,), next_token_loss(ids), (PhiDecoderLayer,)


def _mamba(bench: bool, generator: torch.Generator, use_cache: bool) -> Built:
    from transformers import MambaConfig, MambaForCausalLM
    from transformers.models.mamba.modeling_mamba import MambaBlock

    width, layers, seq, batch = (256, 4, 128, 4) if bench else (32, 2, 16, 2)
    config = MambaConfig(
        vocab_size=512,
        hidden_size=width,
        state_size=16,
        num_hidden_layers=layers,
        expand=2,
        conv_kernel=4,
        use_cache=use_cache,
    )
    model = MambaForCausalLM(config)
    ids = token_ids(config.vocab_size, batch, seq, generator)
    return model, (ids,), next_token_loss(ids), (MambaBlock,)


_BUILDERS: dict[str, Callable[[bool, torch.Generator, bool], Built]] = {
    "lstm": _lstm,
    "custom": _custom,
    "bert": _bert,
    "convnext": _convnext,
    "whisper": _whisper,
    "unet": _unet,
    "phi": _phi,
    "mamba": _mamba,
}


def build(family: str, bench: bool, generator: torch.Generator, use_cache: bool) -> Built:
    """The parts of a ``family`` model (see the module docstring)."""
    return _BUILDERS[family](bench, generator, use_cache)
