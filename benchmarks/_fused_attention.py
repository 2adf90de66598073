"""The zoo's attention run as the device's fused kernel: its attention dropout switched off.

The zoo's transformers train with attention dropout, which sends scaled-dot-product
attention on the host CPU to its math path (products and a softmax the profile prices
operator by operator). A model trained without it, as many are, runs the fused kernel
instead (``_scaled_dot_product_flash_attention_for_cpu``), which the profile prices by
its flops and scores. ``bench_budget.py --fused-attention`` plans and times the zoo
that way, which no rate was tuned on: an out-of-sample check of the attention rates.
"""

from __future__ import annotations

from torch import nn

__all__ = ["without_attention_dropout"]

#: Names of the dropout layers an attention module passes to the fused kernel as ``p``.
_ATTENTION_DROPOUTS = ("attn_dropout", "attention_dropout")


def without_attention_dropout(model: nn.Module) -> list[str]:
    """Set ``model``'s attention dropout to 0, in place; the attributes changed.

    The attention modules' float ``attention_dropout`` (Llama, Mixtral, Phi and most
    decoders of transformers), the float ``dropout`` of a module whose class names
    attention, and the probability of dropout layers named as attention's
    (:data:`_ATTENTION_DROPOUTS`, GPT-2's ``attn_dropout``). Other dropout stays.
    """
    changed = []
    for name, module in model.named_modules():
        for attribute in ("attention_dropout", "dropout"):
            if attribute == "dropout" and "Attention" not in type(module).__name__:
                continue  # before reading it: diffusers warns on a config attribute's read
            value = getattr(module, attribute, None)
            if isinstance(value, float) and value > 0:
                setattr(module, attribute, 0.0)
                changed.append(f"{name}.{attribute}")
        if isinstance(module, nn.Dropout) and name.endswith(_ATTENTION_DROPOUTS) and module.p > 0:
            module.p = 0.0
            changed.append(f"{name}.p")
    return changed
