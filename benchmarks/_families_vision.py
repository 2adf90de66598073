"""The image and diffusion families ``try_families.py`` plans, none of them in the zoo.

Sixteen transformers image classifiers at 32 x 32 pixels, batch 2, three classes,
dropout and stochastic depth on where the family has them: convolutional networks
(ConvNeXt and ConvNeXt V2, RegNet, ResNet, MobileNet V2, EfficientNet, PoolFormer),
vision transformers (DeiT, BEiT with its relative position bias, DINOv2, Swin V2),
and hybrids (SegFormer, MobileViT, LeViT, PVT V2, FocalNet). Six diffusers models,
trained on the mean square of their output: a text-conditioned UNet (cross
attention), a KL autoencoder (its latent sampled from torch's generator), and the
transformers DiT, PixArt, SD3 (joint attention) and Flux (rotary embeddings).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from _family_builders import BATCH, Builder, Tried, generated, image_family, sample_loss

_DEPTH = {"drop_path_rate": 0.1}
_CONVNEXT = {"hidden_sizes": [8, 16], "depths": [1, 1], "num_stages": 2, **_DEPTH}
_VIT = {
    "image_size": 32,
    "patch_size": 8,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "hidden_dropout_prob": 0.1,
}


def _diffusers(model: str, inputs: Callable[[], dict[str, Any]], **settings: Any) -> Builder:
    """A diffusers model, its inputs made when it is built (nothing at import)."""

    def build() -> Tried:
        import diffusers

        built = getattr(diffusers, model)(**settings)
        return Tried(built, inputs(), sample_loss, package="diffusers")

    return build


def _steps() -> torch.Tensor:
    return torch.tensor([3, 7])


def _text(seed: int) -> torch.Tensor:
    """A batch of five 16-wide text embeddings (what a text encoder would hand over)."""
    return generated(seed, BATCH, 5, 16)


VISION: dict[str, Builder] = {
    "convnext": image_family("ConvNextConfig", "ConvNextForImageClassification", **_CONVNEXT),
    "convnextv2": image_family("ConvNextV2Config", "ConvNextV2ForImageClassification", **_CONVNEXT),
    "regnet": image_family(
        "RegNetConfig",
        "RegNetForImageClassification",
        embedding_size=8,
        hidden_sizes=[8, 16],
        depths=[1, 1],
        groups_width=4,
    ),
    "resnet": image_family(
        "ResNetConfig",
        "ResNetForImageClassification",
        embedding_size=16,
        hidden_sizes=[16, 32],
        depths=[1, 1],
        layer_type="bottleneck",
    ),
    "mobilenet_v2": image_family(
        "MobileNetV2Config",
        "MobileNetV2ForImageClassification",
        image_size=32,
        depth_multiplier=0.25,
        classifier_dropout_prob=0.1,
    ),
    "efficientnet": image_family(
        "EfficientNetConfig",
        "EfficientNetForImageClassification",
        image_size=32,
        width_coefficient=0.25,
        depth_coefficient=0.25,
        hidden_dim=320,
        dropout_rate=0.1,
        drop_connect_rate=0.1,
    ),
    "poolformer": image_family(
        "PoolFormerConfig",
        "PoolFormerForImageClassification",
        hidden_sizes=[8, 16, 32, 64],
        depths=[1, 1, 1, 1],
        **_DEPTH,
    ),
    "deit": image_family(
        "DeiTConfig",
        "DeiTForImageClassification",
        intermediate_size=64,
        attention_probs_dropout_prob=0.1,
        **_VIT,
    ),
    "beit": image_family(
        "BeitConfig",
        "BeitForImageClassification",
        intermediate_size=64,
        use_relative_position_bias=True,
        **_VIT,
        **_DEPTH,
    ),
    "dinov2": image_family(
        "Dinov2Config", "Dinov2ForImageClassification", mlp_ratio=2, **_VIT, **_DEPTH
    ),
    "swinv2": image_family(
        "Swinv2Config",
        "Swinv2ForImageClassification",
        image_size=32,
        patch_size=4,
        embed_dim=16,
        depths=[1, 1],
        num_heads=[2, 2],
        window_size=4,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        **_DEPTH,
    ),
    "segformer": image_family(
        "SegformerConfig",
        "SegformerForImageClassification",
        num_encoder_blocks=2,
        depths=[1, 1],
        sr_ratios=[2, 1],
        hidden_sizes=[16, 32],
        patch_sizes=[7, 3],
        strides=[4, 2],
        num_attention_heads=[1, 2],
        mlp_ratios=[2, 2],
        hidden_dropout_prob=0.1,
        **_DEPTH,
    ),
    "mobilevit": image_family(
        "MobileViTConfig",
        "MobileViTForImageClassification",
        image_size=32,
        hidden_sizes=[16, 16, 16],
        neck_hidden_sizes=[8, 8, 16, 16, 16, 32, 64],
        num_attention_heads=2,
        hidden_dropout_prob=0.1,
    ),
    "levit": image_family(
        "LevitConfig",
        "LevitForImageClassification",
        image_size=32,
        hidden_sizes=[32, 48, 64],
        num_attention_heads=[2, 3, 4],
        depths=[1, 1, 1],
        key_dim=[8, 8, 8],
        patch_size=16,
        stride=2,
    ),
    "pvt_v2": image_family(
        "PvtV2Config",
        "PvtV2ForImageClassification",
        image_size=32,
        hidden_sizes=[8, 16, 32, 64],
        depths=[1, 1, 1, 1],
        num_attention_heads=[1, 1, 2, 2],
        **_DEPTH,
    ),
    "focalnet": image_family(
        "FocalNetConfig",
        "FocalNetForImageClassification",
        image_size=32,
        patch_size=4,
        embed_dim=16,
        depths=[1, 1],
        focal_levels=[2, 2],
        **_DEPTH,
    ),
    "unet_text": _diffusers(
        "UNet2DConditionModel",
        lambda: {
            "sample": generated(1, BATCH, 4, 16, 16),
            "timestep": _steps(),
            "encoder_hidden_states": _text(2),
        },
        sample_size=16,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(16, 32),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=16,
        attention_head_dim=8,
        norm_num_groups=8,
    ),
    "autoencoder_kl": _diffusers(
        "AutoencoderKL",
        lambda: {"sample": generated(1, BATCH, 3, 16, 16), "sample_posterior": True},
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(16, 32),
        latent_channels=4,
        norm_num_groups=8,
        sample_size=16,
    ),
    "dit": _diffusers(
        "DiTTransformer2DModel",
        lambda: {
            "hidden_states": generated(1, BATCH, 4, 8, 8),
            "timestep": _steps(),
            "class_labels": torch.tensor([1, 2]),
        },
        num_attention_heads=2,
        attention_head_dim=8,
        in_channels=4,
        num_layers=2,
        sample_size=8,
        patch_size=2,
        num_embeds_ada_norm=10,
        dropout=0.1,
    ),
    "pixart": _diffusers(
        "PixArtTransformer2DModel",
        lambda: {
            "hidden_states": generated(1, BATCH, 4, 8, 8),
            "timestep": _steps(),
            "encoder_hidden_states": _text(2),
            "added_cond_kwargs": {"resolution": None, "aspect_ratio": None},
        },
        num_attention_heads=2,
        attention_head_dim=8,
        in_channels=4,
        out_channels=8,
        num_layers=2,
        sample_size=8,
        patch_size=2,
        cross_attention_dim=16,
        caption_channels=16,
        dropout=0.1,
    ),
    "sd3": _diffusers(
        "SD3Transformer2DModel",
        lambda: {
            "hidden_states": generated(1, BATCH, 4, 8, 8),
            "timestep": _steps(),
            "encoder_hidden_states": _text(2),
            "pooled_projections": generated(3, BATCH, 8),
        },
        sample_size=8,
        patch_size=2,
        in_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=16,
        caption_projection_dim=16,
        pooled_projection_dim=8,
        out_channels=4,
        pos_embed_max_size=16,
    ),
    "flux": _diffusers(
        "FluxTransformer2DModel",
        lambda: {
            "hidden_states": generated(1, BATCH, 16, 16),
            "timestep": torch.tensor([0.3, 0.7]),
            "encoder_hidden_states": _text(2),
            "pooled_projections": generated(3, BATCH, 8),
            "img_ids": torch.zeros(16, 3),
            "txt_ids": torch.zeros(5, 3),
        },
        patch_size=1,
        in_channels=16,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=16,
        pooled_projection_dim=8,
        axes_dims_rope=(2, 2, 4),
    ),
}
