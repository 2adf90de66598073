"""Caches that recomputation would corrupt: transformers' key-value cache.

A decoder layer called with ``use_cache=True`` appends its keys and values to a cache
object (transformers' ``DynamicCache`` and kin) in its forward. Recomputing the layer
in backward appends them a second time: the attention mask no longer matches the
cached length and backward fails with a shape error, or the cache silently holds
every position twice. transformers' own gradient checkpointing switches the cache off
for training and says so; so does accel, for ``apply_activation_checkpointing`` (with
or without a memory budget), :func:`plan_checkpointing` and :meth:`CheckpointPlan.apply`:

* a module's ``config.use_cache`` that is ``True`` is set to ``False``, with a warning
  naming the setting (the model's own default; ``model.generate`` is unaffected),
  except in an encoder-only model (BERT's config defaults to ``use_cache=True`` too,
  but its layers, built as an encoder, never take a cache): left alone, no warning;
* ``use_cache=True`` or a cache object among ``example_inputs`` is refused;
* a checkpointed module called with a cache object while grad is enabled (the caller
  passed ``use_cache=True`` explicitly) raises before its forward runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from accel._warn import warn

__all__ = ["refuse_cache_arguments", "refuse_cache_inputs", "switch_off_kv_cache"]

_ADVICE = (
    "Train with the cache off: pass use_cache=False to the model's forward (or set "
    "model.config.use_cache = False)."
)


# Arguments that are never a cache object. Ruled out by ``isinstance`` first, which
# dynamo traces: it cannot read ``__module__`` of a builtin class (a decoder layer's
# ``use_cache=False``, its ``position_embeddings`` tuple) and would break the graph
# at every checkpointed call.
_NOT_CACHES = (torch.Tensor, bool, int, float, complex, str, bytes, tuple, list, dict, set, slice)


def _is_cache(value: object) -> bool:
    """Whether ``value`` is one of transformers' key-value cache objects."""
    if value is None or isinstance(value, _NOT_CACHES):
        return False
    kind = type(value)
    return kind.__module__.startswith("transformers") and any(
        base.__name__.endswith("Cache") for base in kind.__mro__
    )


def _encoder_only(module: nn.Module, config: Any) -> bool:
    """Whether no layer under ``module`` takes a KV cache: an encoder-only model.

    transformers' encoder families (BERT and its kin) can also be built as decoders,
    and their layers say which they are in an ``is_decoder`` attribute; built as
    encoders they never create or pass a cache, whatever ``config.use_cache`` says.
    Decoder-only families (GPT-2, Llama) have no such attribute and use the cache.
    """
    if getattr(config, "is_encoder_decoder", False) or getattr(config, "is_decoder", False):
        return False
    flags = [
        inner.__dict__["is_decoder"] for inner in module.modules() if "is_decoder" in inner.__dict__
    ]
    return bool(flags) and not any(flags)


def switch_off_kv_cache(model: nn.Module) -> list[str]:
    """Set every ``config.use_cache`` in ``model`` that is ``True`` to ``False``, warning once.

    An encoder-only model (no layer takes a cache, see :func:`_encoder_only`) is left
    as it is, without a warning: there the setting does nothing in training.

    Returns:
        The settings switched off, as ``"<module>.config.use_cache"``.
    """
    switched: list[str] = []
    seen: set[int] = set()
    for name, module in model.named_modules():
        config = module.__dict__.get("config")
        if config is None or id(config) in seen:
            continue
        seen.add(id(config))
        if getattr(config, "use_cache", None) is True and not _encoder_only(module, config):
            config.use_cache = False
            switched.append(f"{name + '.' if name else 'model.'}config.use_cache")
    if switched:
        warn(
            f"checkpointing: {', '.join(switched)} was True; set to False, because "
            "recomputing a checkpointed decoder layer in backward would append its keys "
            "and values to the KV cache a second time (transformers' own gradient "
            "checkpointing does the same). Set it back to True for generation.",
            UserWarning,
        )
    return switched


def refuse_cache_inputs(example_inputs: Any) -> None:
    """Raise ``ValueError`` if ``example_inputs`` ask for or carry a key-value cache."""
    values = example_inputs.values() if isinstance(example_inputs, Mapping) else example_inputs
    if isinstance(example_inputs, Mapping) and example_inputs.get("use_cache") is True:
        raise ValueError(
            "checkpointing: example_inputs pass use_cache=True; a checkpointed decoder "
            "layer would append to the KV cache again when it is recomputed in backward. " + _ADVICE
        )
    if any(_is_cache(value) for value in values):
        raise ValueError(
            "checkpointing: example_inputs carry a key-value cache object; a checkpointed "
            "decoder layer would append to it again when recomputed in backward. " + _ADVICE
        )


def refuse_cache_arguments(
    module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """Raise ``ValueError`` if a checkpointed ``module`` is called with a key-value cache."""
    for key, value in (*enumerate(args), *kwargs.items()):
        if _is_cache(value):
            raise ValueError(
                f"checkpointing: a checkpointed {type(module).__name__} was called with a "
                f"key-value cache ({key}={type(value).__name__}) while grad is enabled; "
                "recomputing it in backward would append its keys and values to the cache "
                "a second time. " + _ADVICE
            )
