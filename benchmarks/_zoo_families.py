"""The zoo's newer families (see ``_zoo.py``): module shapes the first six do not have.

Each builder returns ``(model, inputs, loss_of, block_types)`` for ``_zoo.build``, seeded
by the caller; ``bench`` selects the benchmark's shapes (else the tests' small ones), and
``gpu``, where given (``_zoo.GPU_SIZED``), a family's (width, layers, sequence, batch) for
a CUDA run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = [
    "LSTMLanguageModel",
    "MaskedAutoencoder",
    "MixerLayer",
    "MixerStack",
    "Qwen2Layer",
    "Qwen2Like",
    "SharedLayerModel",
    "SpeechEncoder",
    "SpeechLayer",
    "SwinBlock",
    "SwinTransformer",
    "ViTBlock",
    "build",
    "next_token_loss",
    "token_ids",
]

Built = tuple[nn.Module, Any, Callable[[Any], torch.Tensor], tuple[type[nn.Module], ...]]
Gpu = tuple[int, int, int, int] | None


class LSTMLanguageModel(nn.Module):
    """Embedding, a 2-layer LSTM with dropout between its layers, a linear head."""

    def __init__(self, vocab: int, width: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.lstm = nn.LSTM(width, width, num_layers=2, dropout=0.1, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.lstm(self.embed(ids))
        logits: torch.Tensor = self.head(hidden)
        return logits


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


def _lstm(bench: bool, generator: torch.Generator, use_cache: bool, gpu: Gpu = None) -> Built:
    width, seq, batch = (256, 128, 4) if bench else (32, 16, 2)
    model = LSTMLanguageModel(512, width)
    ids = token_ids(512, batch, seq, generator)
    return model, (ids,), next_token_loss(ids), (nn.LSTM,)


def _custom(bench: bool, generator: torch.Generator, use_cache: bool, gpu: Gpu = None) -> Built:
    width, layers, seq, batch = (256, 4, 128, 4) if bench else (32, 2, 16, 2)
    model = MixerStack(width, layers)
    x = torch.randn(batch, seq, width, generator=generator)
    labels = torch.randint(10, (batch,), generator=generator)
    return model, (x,), lambda out: nn.functional.cross_entropy(out, labels), (MixerLayer,)


def _bert(bench: bool, generator: torch.Generator, use_cache: bool, gpu: Gpu = None) -> Built:
    from transformers import BertConfig, BertForMaskedLM
    from transformers.models.bert.modeling_bert import BertLayer

    width, layers, seq, batch = gpu or ((256, 4, 128, 4) if bench else (32, 2, 16, 2))
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


def _convnext(bench: bool, generator: torch.Generator, use_cache: bool, gpu: Gpu = None) -> Built:
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


def _whisper(bench: bool, generator: torch.Generator, use_cache: bool, gpu: Gpu = None) -> Built:
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


def _unet(bench: bool, generator: torch.Generator, use_cache: bool, gpu: Gpu = None) -> Built:
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


def _phi(bench: bool, generator: torch.Generator, use_cache: bool, gpu: Gpu = None) -> Built:
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


def _mamba(bench: bool, generator: torch.Generator, use_cache: bool, gpu: Gpu = None) -> Built:
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


class SharedLayerModel(nn.Module):
    """One ``nn.TransformerEncoderLayer`` called at every depth (ALBERT, looped transformers).

    An embedding, the one shared layer (dropout on, ``batch_first``) run ``depth`` times,
    a final norm and a head: the layer's parameters are used ``depth`` times per step.
    """

    def __init__(self, vocab: int, width: int, depth: int = 6, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.layer = nn.TransformerEncoderLayer(
            width, heads, 4 * width, dropout=0.1, batch_first=True
        )
        self.depth = depth
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(ids)
        for _ in range(self.depth):
            hidden = self.layer(hidden)
        logits: torch.Tensor = self.head(self.norm(hidden))
        return logits


class RMSNorm(nn.Module):
    """Root-mean-square normalisation with a learnt scale (Llama, Qwen2)."""

    def __init__(self, width: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * (x * scale)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of ``x`` (``batch, heads, seq, head_dim``)."""
    return x * cos + _rotate_half(x) * sin


class Qwen2Layer(nn.Module):
    """A Qwen2 decoder layer: GQA with biased q/k/v and RoPE, RMSNorm, a SwiGLU MLP."""

    def __init__(self, width: int, heads: int, kv_heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, width // heads
        self.dropout = dropout
        self.input_norm = RMSNorm(width)
        self.q_proj = nn.Linear(width, heads * self.head_dim)
        self.k_proj = nn.Linear(width, kv_heads * self.head_dim)
        self.v_proj = nn.Linear(width, kv_heads * self.head_dim)
        self.o_proj = nn.Linear(heads * self.head_dim, width, bias=False)
        self.post_norm = RMSNorm(width)
        self.gate_proj = nn.Linear(width, 3 * width, bias=False)
        self.up_proj = nn.Linear(width, 3 * width, bias=False)
        self.down_proj = nn.Linear(3 * width, width, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        hidden = self.input_norm(x)
        q = self.q_proj(hidden).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(hidden).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(hidden).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        groups = self.heads // self.kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        attended = nn.functional.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        x = x + self.o_proj(attended.transpose(1, 2).reshape(batch, seq, -1))
        hidden = self.post_norm(x)
        gated = nn.functional.silu(self.gate_proj(hidden)) * self.up_proj(hidden)
        mixed: torch.Tensor = x + self.down_proj(gated)
        return mixed


class Qwen2Like(nn.Module):
    """A Qwen2-style causal LM: 8 query heads sharing 2 key-value heads, RoPE, RMSNorm."""

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, vocab: int, width: int, layers: int, seq: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(Qwen2Layer(width, 8, 2, dropout=0.1) for _ in range(layers))
        self.norm = RMSNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        head_dim = width // 8
        inverse = 1.0 / 10000 ** (torch.arange(0, head_dim, 2).float() / head_dim)
        angles = torch.outer(torch.arange(seq).float(), inverse)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(ids)
        cos, sin = self.cos[: ids.shape[1]], self.sin[: ids.shape[1]]
        for layer in self.layers:
            hidden = layer(hidden, cos, sin)
        logits: torch.Tensor = self.head(self.norm(hidden))
        return logits


class ViTBlock(nn.Module):
    """A pre-norm ViT block: multi-head self-attention and a GELU MLP, with dropout."""

    def __init__(self, width: int, heads: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Dropout(dropout), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        qkv = self.qkv(self.norm1(x)).view(batch, tokens, 3, self.heads, width // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        attended = nn.functional.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0
        )
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, tokens, width))
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out


class MaskedAutoencoder(nn.Module):
    """A masked autoencoder (MAE): the patch mask is drawn inside ``forward``.

    Each step keeps a random quarter of the patches (``torch.rand`` noise, ``argsort``,
    ``gather``, as MAE does), encodes them with ViT blocks, restores the order with mask
    tokens, decodes with narrower ViT blocks and scores the pixels of the masked patches.
    ``forward`` returns a dict: the loss, the predicted patches and the mask.
    """

    def __init__(self, side: int, patch: int, width: int, layers: int, decoder_width: int) -> None:
        super().__init__()
        self.patch, self.patches = patch, (side // patch) ** 2
        self.keep = self.patches // 4
        self.embed = nn.Conv2d(3, width, patch, stride=patch)
        self.position = nn.Parameter(torch.randn(1, self.patches, width) * 0.02)
        self.encoder = nn.ModuleList(ViTBlock(width, 4) for _ in range(layers))
        self.encoder_norm = nn.LayerNorm(width)
        self.to_decoder = nn.Linear(width, decoder_width)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, decoder_width))
        self.decoder_position = nn.Parameter(torch.randn(1, self.patches, decoder_width) * 0.02)
        self.decoder = nn.ModuleList(ViTBlock(decoder_width, 4) for _ in range(2))
        self.decoder_norm = nn.LayerNorm(decoder_width)
        self.predict = nn.Linear(decoder_width, 3 * patch * patch)

    def patchify(self, images: torch.Tensor) -> torch.Tensor:
        """``(batch, 3, side, side)`` images as ``(batch, patches, 3 * patch**2)`` rows."""
        p = self.patch
        batch, channels, side, _ = images.shape
        grid = images.reshape(batch, channels, side // p, p, side // p, p)
        return grid.permute(0, 2, 4, 3, 5, 1).reshape(batch, self.patches, p * p * channels)

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        tokens = self.embed(images).flatten(2).transpose(1, 2) + self.position
        batch, patches, width = tokens.shape
        noise = torch.rand(batch, patches, device=images.device)
        shuffle = noise.argsort(dim=1)
        restore = shuffle.argsort(dim=1)
        kept = shuffle[:, : self.keep]
        hidden = tokens.gather(1, kept.unsqueeze(-1).expand(-1, -1, width))
        for block in self.encoder:
            hidden = block(hidden)
        hidden = self.to_decoder(self.encoder_norm(hidden))
        masked = self.mask_token.expand(batch, patches - self.keep, -1)
        hidden = torch.cat((hidden, masked), dim=1)
        hidden = hidden.gather(1, restore.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
        hidden = hidden + self.decoder_position
        for block in self.decoder:
            hidden = block(hidden)
        predicted = self.predict(self.decoder_norm(hidden))
        mask = torch.ones(batch, patches, device=images.device)
        mask[:, : self.keep] = 0
        mask = mask.gather(1, restore)
        error = (predicted - self.patchify(images)).pow(2).mean(dim=-1)
        loss = (error * mask).sum() / mask.sum()
        return {"loss": loss, "predicted": predicted, "mask": mask}


class SpeechLayer(nn.Module):
    """A wav2vec 2.0 encoder layer: post-norm self-attention and a GELU feed-forward."""

    def __init__(self, width: int, heads: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(width, heads, dropout=dropout, batch_first=True)
        self.dropout = nn.Dropout(dropout)
        self.norm = nn.LayerNorm(width)
        self.feed_forward = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Dropout(dropout), nn.Linear(4 * width, width)
        )
        self.final_norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        attended, _ = self.attention(x, x, x, need_weights=False)
        x = self.norm(x + self.dropout(attended))
        out: torch.Tensor = self.final_norm(x + self.dropout(self.feed_forward(x)))
        return out


class SpeechEncoder(nn.Module):
    """A wav2vec 2.0-like speech classifier on raw audio.

    A convolutional feature encoder (strided ``Conv1d`` layers, GroupNorm on the first,
    GELU), a feature projection (LayerNorm, Linear, dropout), a grouped convolutional
    position embedding, :class:`SpeechLayer` blocks, mean pooling and a classifier.
    """

    def __init__(
        self, channels: int, kernels: list[tuple[int, int]], width: int, layers: int
    ) -> None:
        super().__init__()
        convolutions: list[nn.Module] = []
        inputs = 1
        for index, (kernel, stride) in enumerate(kernels):
            convolutions.append(nn.Conv1d(inputs, channels, kernel, stride=stride, bias=False))
            if index == 0:
                convolutions.append(nn.GroupNorm(channels, channels))
            convolutions.append(nn.GELU())
            inputs = channels
        self.features = nn.Sequential(*convolutions)
        self.projection = nn.Sequential(
            nn.LayerNorm(channels), nn.Linear(channels, width), nn.Dropout(0.1)
        )
        self.position = nn.Conv1d(width, width, 15, padding=7, groups=4)
        self.norm = nn.LayerNorm(width)
        self.layers = nn.ModuleList(SpeechLayer(width, 4) for _ in range(layers))
        self.classify = nn.Linear(width, 10)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        frames = self.projection(self.features(audio.unsqueeze(1)).transpose(1, 2))
        position = nn.functional.gelu(self.position(frames.transpose(1, 2))).transpose(1, 2)
        hidden = self.norm(frames + position)
        for layer in self.layers:
            hidden = layer(hidden)
        logits: torch.Tensor = self.classify(hidden.mean(dim=1))
        return logits


def _to_windows(x: torch.Tensor, window: int) -> torch.Tensor:
    """``(batch, height, width, channels)`` as ``(batch * windows, window**2, channels)``."""
    batch, height, width, channels = x.shape
    grid = x.view(batch, height // window, window, width // window, window, channels)
    return grid.permute(0, 1, 3, 2, 4, 5).reshape(-1, window * window, channels)


def _from_windows(windows: torch.Tensor, window: int, shape: torch.Size) -> torch.Tensor:
    """The inverse of :func:`_to_windows` for a ``shape`` ``(batch, height, width, _)``."""
    batch, height, width, _ = shape
    channels = windows.shape[-1]
    grid = windows.view(batch, height // window, width // window, window, window, channels)
    return grid.permute(0, 1, 3, 2, 4, 5).reshape(batch, height, width, channels)


class SwinBlock(nn.Module):
    """A Swin block: (shifted) window attention with a relative position bias, an MLP.

    Pre-norm, dropout on the attention and the MLP; a shifted block rolls its input by
    half a window and masks attention between the regions the roll brought together.
    """

    mask: torch.Tensor | None
    index: torch.Tensor

    def __init__(self, width: int, heads: int, resolution: int, window: int, shift: bool) -> None:
        super().__init__()
        window = min(window, resolution)
        self.heads, self.window = heads, window
        self.shift = window // 2 if shift and resolution > window else 0
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.bias_table = nn.Parameter(torch.randn((2 * window - 1) ** 2, heads) * 0.02)
        coords = torch.stack(
            torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")
        ).flatten(1)
        relative = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (window - 1)
        self.register_buffer(
            "index", relative[..., 0] * (2 * window - 1) + relative[..., 1], persistent=False
        )
        mask = None
        if self.shift:
            regions = torch.zeros(1, resolution, resolution, 1)
            spans = (slice(0, -window), slice(-window, -self.shift), slice(-self.shift, None))
            for number, (rows, columns) in enumerate((r, c) for r in spans for c in spans):
                regions[:, rows, columns, :] = number
            labels = _to_windows(regions, window).squeeze(-1)
            different = labels[:, None, :] != labels[:, :, None]
            mask = torch.zeros(different.shape).masked_fill(different, -100.0)
        self.register_buffer("mask", mask, persistent=False)
        self.drop = nn.Dropout(0.1)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Dropout(0.1), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.norm1(x)
        if self.shift:
            hidden = torch.roll(hidden, (-self.shift, -self.shift), dims=(1, 2))
        windows = _to_windows(hidden, self.window)
        count, tokens, width = windows.shape
        qkv = self.qkv(windows).view(count, tokens, 3, self.heads, width // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        bias = self.bias_table[self.index.view(-1)].view(tokens, tokens, -1).permute(2, 0, 1)
        bias = bias.unsqueeze(0)
        if self.mask is not None:
            per_image = self.mask.shape[0]
            bias = bias.unsqueeze(0) + self.mask[None, :, None]
            bias = bias.expand(count // per_image, -1, -1, -1, -1).reshape(
                count, self.heads, tokens, tokens
            )
        attended = nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=bias, dropout_p=0.1 if self.training else 0.0
        )
        windows = self.proj(attended.transpose(1, 2).reshape(count, tokens, width))
        hidden = _from_windows(windows, self.window, x.shape)
        if self.shift:
            hidden = torch.roll(hidden, (self.shift, self.shift), dims=(1, 2))
        x = x + self.drop(hidden)
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out


class PatchMerging(nn.Module):
    """Swin's downsampling: each 2x2 patch group concatenated, normalised, projected."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(4 * width)
        self.reduce = nn.Linear(4 * width, 2 * width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = (x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2])
        merged: torch.Tensor = self.reduce(self.norm(torch.cat(parts, dim=-1)))
        return merged


class SwinTransformer(nn.Module):
    """A Swin transformer classifier: stages of (shifted) window blocks, patch merging."""

    def __init__(self, side: int, patch: int, width: int, depths: list[int], window: int) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, width, patch, stride=patch)
        self.embed_norm = nn.LayerNorm(width)
        stages: list[nn.Module] = []
        resolution = side // patch
        for number, depth in enumerate(depths):
            heads = 2 * 2**number
            stages.extend(
                SwinBlock(width, heads, resolution, window, shift=index % 2 == 1)
                for index in range(depth)
            )
            if number < len(depths) - 1:
                stages.append(PatchMerging(width))
                width, resolution = 2 * width, resolution // 2
        self.stages = nn.Sequential(*stages)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 10)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_norm(self.embed(images).permute(0, 2, 3, 1))
        hidden = self.norm(self.stages(hidden))
        logits: torch.Tensor = self.head(hidden.mean(dim=(1, 2)))
        return logits


def _shared(bench: bool, generator: torch.Generator, use_cache: bool, gpu: Gpu = None) -> Built:
    width, depth, seq, batch = gpu or ((256, 6, 128, 4) if bench else (32, 6, 16, 2))
    model = SharedLayerModel(512, width, depth)
    ids = token_ids(512, batch, seq, generator)
    return model, (ids,), next_token_loss(ids), (nn.TransformerEncoderLayer,)


def _albert(bench: bool, generator: torch.Generator, use_cache: bool, gpu: Gpu = None) -> Built:
    from transformers import AlbertConfig, AlbertForMaskedLM
    from transformers.models.albert.modeling_albert import AlbertLayer

    width, seq, batch = (256, 128, 4) if bench else (32, 16, 2)
    config = AlbertConfig(
        vocab_size=512,
        embedding_size=width // 2,
        hidden_size=width,
        num_hidden_layers=6,  # one layer group, its one layer run six times
        num_attention_heads=4,
        intermediate_size=4 * width,
        max_position_embeddings=2 * seq,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
    )
    model = AlbertForMaskedLM(config)
    ids = token_ids(config.vocab_size, batch, seq, generator)
    labels = torch.where(torch.rand(batch, seq, generator=generator) < 0.15, ids, -100)
    labels[0, 0] = ids[0, 0]  # at least one masked position
    inputs = {"input_ids": ids, "labels": labels}
    return model, inputs, lambda out: out.loss, (AlbertLayer,)


def _qwen2(bench: bool, generator: torch.Generator, use_cache: bool, gpu: Gpu = None) -> Built:
    width, layers, seq, batch = gpu or ((256, 4, 128, 4) if bench else (32, 2, 16, 2))
    model = Qwen2Like(512, width, layers, seq)
    ids = token_ids(512, batch, seq, generator)
    return model, (ids,), next_token_loss(ids), (Qwen2Layer,)


def _mae(bench: bool, generator: torch.Generator, use_cache: bool, gpu: Gpu = None) -> Built:
    side, patch, width, layers, decoder, batch = (
        (64, 4, 256, 4, 128, 8) if bench else (16, 4, 32, 2, 16, 2)
    )
    model = MaskedAutoencoder(side, patch, width, layers, decoder)
    images = torch.randn(batch, 3, side, side, generator=generator)
    return model, (images,), lambda out: out["loss"], (ViTBlock,)


def _swin(bench: bool, generator: torch.Generator, use_cache: bool, gpu: Gpu = None) -> Built:
    side, patch, width, depths, window, batch = (
        (64, 4, 64, [2, 2, 2], 4, 8) if bench else (16, 2, 16, [2, 1], 4, 2)
    )
    model = SwinTransformer(side, patch, width, depths, window)
    images = torch.randn(batch, 3, side, side, generator=generator)
    labels = torch.randint(10, (batch,), generator=generator)
    return model, (images,), lambda out: nn.functional.cross_entropy(out, labels), (SwinBlock,)


def _wav2vec(bench: bool, generator: torch.Generator, use_cache: bool, gpu: Gpu = None) -> Built:
    if bench:
        channels, width, layers, samples, batch = 64, 256, 4, 10240, 4  # 127 frames
        kernels = [(10, 5), (3, 2), (3, 2), (3, 2), (2, 2)]
    else:
        channels, width, layers, samples, batch = 16, 32, 2, 800, 2
        kernels = [(10, 5), (3, 2), (3, 2)]
    model = SpeechEncoder(channels, kernels, width, layers)
    audio = torch.randn(batch, samples, generator=generator)
    labels = torch.randint(10, (batch,), generator=generator)
    return model, (audio,), lambda out: nn.functional.cross_entropy(out, labels), (SpeechLayer,)


_BUILDERS: dict[str, Callable[[bool, torch.Generator, bool, Gpu], Built]] = {
    "lstm": _lstm,
    "custom": _custom,
    "bert": _bert,
    "convnext": _convnext,
    "whisper": _whisper,
    "unet": _unet,
    "phi": _phi,
    "mamba": _mamba,
    "shared": _shared,
    "albert": _albert,
    "qwen2": _qwen2,
    "mae": _mae,
    "wav2vec": _wav2vec,
    "swin": _swin,
}


def build(
    family: str, bench: bool, generator: torch.Generator, use_cache: bool, gpu: Gpu = None
) -> Built:
    """The parts of a ``family`` model (see the module docstring)."""
    return _BUILDERS[family](bench, generator, use_cache, gpu)
