"""A model zoo for the memory budget: one small model per family, random weights.

Every model is built from a config (nothing is downloaded) and trains in a few tens of
milliseconds on a host CPU at the ``small`` size the tests use; ``size="bench"`` gives
the benchmark's larger shapes, and ``size="gpu"`` wider and longer ones for a CUDA run
of a subset (:data:`GPU_SIZED`; ``gpu_size`` says what another family runs at). Families:

* ``resnet``: a ResNet-style CNN (Conv2d, BatchNorm2d, ReLU, Dropout2d, residual blocks);
* ``vit``: transformers' ViT (patch embedding, pre-norm encoder layers, dropout);
* ``gpt2``: transformers' GPT-2 (fused QKV, GELU, dropout);
* ``llama``: transformers' Llama (GQA, RoPE, RMSNorm, SwiGLU, attention dropout);
* ``t5``: transformers' T5 encoder-decoder (relative position bias, cross-attention,
  keyword arguments, tuple outputs);
* ``mixtral``: transformers' Mixtral mixture of experts (top-2 routing, index ops);
* ``lstm``: an LSTM language model (``nn.Embedding``, a 2-layer ``nn.LSTM`` with dropout
  between its layers, ``nn.Linear``): the work is done by one module without children;
* ``custom``: a stack of a user's own childless layers (their own parameters and
  functional operators, dropout included), and a root whose forward does work itself;
* ``bert``: transformers' BERT masked LM (post-norm encoder, padding mask, labels);
* ``convnext``: transformers' ConvNeXt (depthwise 7x7 convolutions, LayerNorm, layer
  scale, stochastic depth);
* ``whisper``: transformers' Whisper (a conv front-end on log-mel features, encoder and
  decoder with cross-attention);
* ``unet``: diffusers' ``UNet2DModel`` (GroupNorm, skip concatenations, a time
  embedding, self-attention in one down and one up block);
* ``phi``: transformers' Phi (parallel attention and MLP, partial rotary embedding);
* ``mamba``: transformers' Mamba (selective state space, causal conv; the slow path, no
  CUDA kernels);
* ``shared``: one ``nn.TransformerEncoderLayer`` (dropout, ``batch_first``) called at
  each of six depths between an embedding and a head (weight sharing, as in ALBERT and
  looped transformers): a block called more than once per step;
* ``albert``: transformers' ALBERT masked LM (one layer group whose one ``AlbertLayer``
  runs at six depths, factorised embeddings): the same sharing, built by transformers;
* ``qwen2``: a Qwen2-style decoder in plain torch (grouped-query attention, 8 query and
  2 key-value heads, biased q/k/v, rotary embeddings, RMSNorm, SwiGLU, SDPA with
  attention dropout);
* ``mae``: a masked autoencoder in plain torch whose forward draws its random patch
  mask (``torch.rand``, ``argsort``, ``gather``), ViT encoder blocks and a narrower
  decoder of the same block class, a dict output;
* ``wav2vec``: a wav2vec 2.0-like speech encoder in plain torch (a strided ``Conv1d``
  feature encoder with GroupNorm, a grouped convolutional position embedding,
  post-norm ``nn.MultiheadAttention`` layers);
* ``swin``: a Swin transformer in plain torch (window attention with a relative
  position bias, shifted windows with their mask and ``torch.roll``, patch merging).

``shared``, ``qwen2``, ``mae``, ``wav2vec`` and ``swin`` are plain torch: they need no package
beyond torch.

Each :class:`ZooModel` names its repeated blocks' class (for "checkpoint every block")
and its loss, so that the benchmark and the tests train every family the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = [
    "FAMILIES",
    "GPU_SIZED",
    "REQUIRES",
    "SIZES",
    "TESTED",
    "TRANSFORMERS",
    "ZooModel",
    "build",
    "gpu_size",
    "unusable",
]

FAMILIES = (
    "resnet",
    "vit",
    "gpt2",
    "llama",
    "t5",
    "mixtral",
    "lstm",
    "custom",
    "bert",
    "convnext",
    "whisper",
    "unet",
    "phi",
    "mamba",
    "shared",
    "albert",
    "qwen2",
    "mae",
    "wav2vec",
    "swin",
)
# Transformer-shaped families (the benchmark's tighter time target).
TRANSFORMERS = (
    *("vit", "gpt2", "llama", "t5", "mixtral", "bert", "whisper", "phi"),
    *("shared", "albert", "qwen2", "mae", "wav2vec", "swin"),
)
# The package each family is built with, where it needs one beyond torch.
REQUIRES = {
    **dict.fromkeys(("vit", "gpt2", "llama", "t5", "mixtral"), "transformers"),
    **dict.fromkeys(("bert", "convnext", "whisper", "phi", "mamba", "albert"), "transformers"),
    "unet": "diffusers",
}
# What the tests plan on every CI run: the first six, the two module shapes without
# children, one encoder and one convolutional family from the newer ones (the
# benchmark covers every family).
TESTED = ("resnet", "vit", "gpt2", "llama", "t5", "mixtral", "lstm", "custom", "bert", "convnext")
SIZES = ("small", "bench", "gpu")
#: The families with a ``gpu`` size, and their (width, layers, sequence, batch); ``resnet``:
#: (channels, blocks, image side, batch), ``vit``: the sequence is its patches (side 4x128
#: /4). Sized from their matrix work (about 5 TFLOP a step for the transformers) for a
#: family's variants to run in well under a minute on an H100 in fp32; not yet run there.
GPU_SIZED: dict[str, tuple[int, int, int, int]] = {
    "gpt2": (1024, 8, 1024, 8),
    "llama": (1024, 8, 1024, 8),
    "qwen2": (1024, 8, 1024, 8),
    "vit": (1024, 8, 1024, 8),
    "resnet": (128, 8, 64, 64),
    "shared": (1024, 6, 1024, 8),
    "bert": (1024, 8, 1024, 8),
}


def gpu_size(family: str, size: str) -> tuple[str, str | None]:
    """The size ``family`` is built at when ``size`` is asked for, and a line saying why not.

    Only the ``gpu`` size falls back: a family without one (not in :data:`GPU_SIZED`)
    runs at its ``bench`` size, and the line says so.
    """
    if size not in SIZES:
        raise ValueError(f"unknown zoo size {size!r}; expected one of {', '.join(SIZES)}")
    if size == "gpu" and family not in GPU_SIZED:
        return "bench", (
            f"{family}: the zoo has no gpu size for this family, so it runs at its bench size "
            f"(gpu sizes: {', '.join(GPU_SIZED)})."
        )
    return size, None


def unusable(family: str) -> str | None:
    """Why ``family`` cannot be built here (its package missing or unusable), or ``None``."""
    import importlib.util

    package = REQUIRES.get(family)
    if package is None:
        return None
    if importlib.util.find_spec(package) is None:
        return f"{package} is not installed (pip install {package})"
    if package == "transformers":
        import transformers

        if not transformers.utils.is_torch_available():
            # transformers 5.x treats a torch older than its floor (2.6) as absent.
            return (
                f"transformers {transformers.__version__} does not support torch "
                f"{torch.__version__}; the transformer families run where it does"
            )
    if package == "diffusers":
        try:
            import diffusers  # noqa: F401
        except Exception as error:  # an install that does not import with this torch
            return f"diffusers does not import here ({type(error).__name__}: {error})"[:200]
    return None


@dataclass
class ZooModel:
    """A zoo model, its training inputs, its loss and its repeated blocks' class."""

    family: str
    model: nn.Module
    inputs: tuple[Any, ...] | dict[str, Any]
    loss_of: Callable[[Any], torch.Tensor]
    block_types: tuple[type[nn.Module], ...]

    def call(self, model: nn.Module) -> Any:
        """``model`` run on the inputs (positional or keyword)."""
        if isinstance(self.inputs, dict):
            return model(**self.inputs)
        return model(*self.inputs)

    def loss(self, model: nn.Module) -> torch.Tensor:
        return self.loss_of(self.call(model))

    def is_block(self, module: nn.Module) -> bool:
        return isinstance(module, self.block_types)

    def to(self, device: torch.device | str) -> ZooModel:
        """Move the model, the inputs and the tensors the loss holds (labels) to ``device``.

        The losses are closures over their targets: each closure's (and its nested
        closures') tensor cells are replaced by their copies on ``device``.
        """
        self.model.to(device)
        self.inputs = torch.utils._pytree.tree_map(
            lambda value: value.to(device) if isinstance(value, torch.Tensor) else value,
            self.inputs,
        )
        pending: list[Any] = [self.loss_of]
        while pending:
            function = pending.pop()
            for cell in getattr(function, "__closure__", None) or ():
                value = cell.cell_contents
                if isinstance(value, torch.Tensor):
                    cell.cell_contents = value.to(device)
                elif callable(value) and getattr(value, "__closure__", None):
                    pending.append(value)
        return self

    def held(self, model: nn.Module) -> tuple[int, int]:
        """(live bytes after ``model``'s forward, bytes of the storages autograd saved)."""
        from checkpointing import LiveActivationMeter, SavedTensorMeter

        exclude = [*model.parameters(), *model.buffers()]
        with (
            LiveActivationMeter(exclude=exclude) as live,
            SavedTensorMeter(exclude=exclude) as saved,
        ):
            out = self.call(model)
        counted = live.bytes, saved.bytes
        self.loss_of(out).backward()
        model.zero_grad(set_to_none=True)
        return counted


class _Residual(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.drop = nn.Dropout2d(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.bn1(self.conv1(x)))
        hidden = self.drop(self.bn2(self.conv2(hidden)))
        return torch.relu(x + hidden)


class ResNet(nn.Module):
    """A ResNet-style CNN: a stem, residual blocks with BatchNorm and Dropout2d, a head."""

    def __init__(self, channels: int, blocks: int, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels), nn.ReLU()
        )
        self.blocks = nn.Sequential(*(_Residual(channels) for _ in range(blocks)))
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.blocks(self.stem(x))
        return self.head(hidden.mean(dim=(2, 3)))


def _newer() -> Any:
    """``_zoo_families.py`` beside this file (loaded by path: the tests load this one so)."""
    import importlib.util
    import sys
    from pathlib import Path

    name = "accel_zoo_families"
    if name not in sys.modules:
        path = Path(__file__).with_name("_zoo_families.py")
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def build(family: str, size: str = "small", *, use_cache: bool = False) -> ZooModel:
    """The zoo's ``family`` model, seeded, in training mode.

    Args:
        family: One of :data:`FAMILIES`.
        size: ``"small"`` (tests: a few milliseconds a step), ``"bench"``, or ``"gpu"``
            (the families in :data:`GPU_SIZED` alone).
        use_cache: For the decoders: the config's ``use_cache`` (transformers' KV cache).

    Raises:
        ValueError: For an unknown family or size, or ``"gpu"`` for a family without it.
    """
    if size not in SIZES or (size == "gpu" and family not in GPU_SIZED):
        raise ValueError(
            f"no zoo size {size!r} for {family!r}; sizes: {', '.join(SIZES)}, the gpu size "
            f"for {', '.join(GPU_SIZED)} alone"
        )
    bench = size == "bench"
    gpu = GPU_SIZED[family] if size == "gpu" else None
    _ids, _causal_lm_loss = _newer().token_ids, _newer().next_token_loss
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    width, layers, seq, batch = gpu or ((256, 4, 128, 4) if bench else (32, 2, 16, 2))
    if family == "resnet":
        channels, side = (32, 48) if bench else (8, 12)
        blocks, count = (6, 16) if bench else (2, 4)
        if gpu is not None:
            channels, blocks, side, count = gpu
        model: nn.Module = ResNet(channels, blocks)
        images = torch.randn(count, 3, side, side, generator=generator)
        labels = torch.randint(10, (images.shape[0],), generator=generator)
        zoo = ZooModel(
            family,
            model,
            (images,),
            lambda out: nn.functional.cross_entropy(out, labels),
            (_Residual,),
        )
    elif family == "vit":
        from transformers import ViTConfig, ViTForImageClassification
        from transformers.models.vit.modeling_vit import ViTLayer

        side = 128 if gpu is not None else 64 if bench else 16
        vit = ViTConfig(
            hidden_size=width,
            num_hidden_layers=layers,
            num_attention_heads=4,
            intermediate_size=4 * width,
            image_size=side,
            patch_size=4,
            num_labels=10,
            hidden_dropout_prob=0.1,
            attention_probs_dropout_prob=0.1,
        )
        model = ViTForImageClassification(vit)
        images = torch.randn(batch, 3, side, side, generator=generator)
        labels = torch.randint(10, (images.shape[0],), generator=generator)
        zoo = ZooModel(
            family,
            model,
            (images,),
            lambda out: nn.functional.cross_entropy(out.logits, labels),
            (ViTLayer,),
        )
    elif family == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        from transformers.models.gpt2.modeling_gpt2 import GPT2Block

        gpt = GPT2Config(
            n_layer=layers,
            n_embd=width,
            n_head=4,
            n_positions=seq,
            vocab_size=512,
            bos_token_id=0,
            eos_token_id=0,
            use_cache=use_cache,
        )
        model = GPT2LMHeadModel(gpt)
        ids = _ids(gpt.vocab_size, batch, seq, generator)
        zoo = ZooModel(family, model, (ids,), _causal_lm_loss(ids), (GPT2Block,))
    elif family == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer

        llama = LlamaConfig(
            hidden_size=width,
            intermediate_size=3 * width,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=512,
            max_position_embeddings=2 * seq,
            attention_dropout=0.1,
            use_cache=use_cache,
        )
        model = LlamaForCausalLM(llama)
        ids = _ids(llama.vocab_size, batch, seq, generator)
        zoo = ZooModel(family, model, (ids,), _causal_lm_loss(ids), (LlamaDecoderLayer,))
    elif family == "t5":
        from transformers import T5Config, T5ForConditionalGeneration
        from transformers.models.t5.modeling_t5 import T5Block

        t5 = T5Config(
            vocab_size=512,
            d_model=width,
            d_kv=width // 4,
            d_ff=2 * width,
            num_layers=layers,
            num_heads=4,
            dropout_rate=0.1,
            decoder_start_token_id=0,
            use_cache=use_cache,
        )
        model = T5ForConditionalGeneration(t5)
        ids = _ids(t5.vocab_size, batch, seq, generator)
        labels = _ids(t5.vocab_size, batch, seq // 2, generator)
        zoo = ZooModel(
            family,
            model,
            {"input_ids": ids, "labels": labels},
            lambda out: out.loss,
            (T5Block,),
        )
    elif family == "mixtral":
        from transformers import MixtralConfig, MixtralForCausalLM
        from transformers.models.mixtral.modeling_mixtral import MixtralDecoderLayer

        mixtral = MixtralConfig(
            hidden_size=width,
            intermediate_size=2 * width,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_local_experts=4,
            num_experts_per_tok=2,
            vocab_size=512,
            max_position_embeddings=2 * seq,
            attention_dropout=0.1,
            use_cache=use_cache,
        )
        model = MixtralForCausalLM(mixtral)
        ids = _ids(mixtral.vocab_size, batch, seq, generator)
        zoo = ZooModel(family, model, (ids,), _causal_lm_loss(ids), (MixtralDecoderLayer,))
    elif family in FAMILIES:
        built = _newer().build(family, bench, generator, use_cache, gpu)
        zoo = ZooModel(family, *built)
    else:
        raise ValueError(f"unknown zoo family {family!r}; expected one of {', '.join(FAMILIES)}")
    zoo.model.train()
    return zoo
