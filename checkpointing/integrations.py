"""Make Hugging Face ``transformers`` models checkpoint through :func:`checkpointing.checkpoint`.

transformers (since 4.35) runs each checkpointed layer through the layer's
``_gradient_checkpointing_func`` attribute, which its ``gradient_checkpointing_enable``
(``activation_checkpointing_enable`` since 5.x) sets to
``functools.partial(torch.utils.checkpoint.checkpoint, **kwargs)``.
:func:`enable_gradient_checkpointing` calls that public method, so transformers does its
own bookkeeping (the support check, the layer flags, input gradients for the reentrant
variant, PEFT), then points the same attribute of the same layers at our checkpoint.
Nothing global changes: neither torch nor transformers is patched, and other models
keep transformers' own checkpointing.

Example::

    from transformers import AutoModelForCausalLM
    from checkpointing.integrations import enable_gradient_checkpointing

    model = AutoModelForCausalLM.from_pretrained("gpt2")
    enable_gradient_checkpointing(model)
    model.train()
    model(**batch).loss.backward()

transformers is an optional dependency (``pip install 'accel[hf]'``); this module does
not import it, and works on any model object with transformers' checkpointing API.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, cast

from torch import nn

from accel import Accelerator

from ._checkpoint import checkpoint

__all__ = ["disable_gradient_checkpointing", "enable_gradient_checkpointing"]

_FUNC = "_gradient_checkpointing_func"


def _method(model: nn.Module, *names: str) -> Callable[..., Any]:
    """Return the first of ``model``'s methods ``names`` that exists (newest name first)."""
    for name in names:
        method = getattr(model, name, None)
        if callable(method):
            return cast("Callable[..., Any]", method)
    raise TypeError(
        f"checkpointing.integrations: {type(model).__name__} has no {names[-1]}() method, so "
        "it is not a Hugging Face transformers model (PreTrainedModel). Pass a transformers "
        "model, or wrap the layers of other models with checkpointing.checkpoint_wrapper "
        "or checkpointing.apply_activation_checkpointing."
    )


def enable_gradient_checkpointing(
    model: nn.Module,
    *,
    use_reentrant: bool = False,
    preserve_rng_state: bool = True,
    backend: Accelerator | str | None = None,
    **kwargs: Any,
) -> None:
    """Turn on activation checkpointing in a transformers model, with our checkpoint.

    The one call replaces ``model.gradient_checkpointing_enable(...)``: the layers that
    transformers checkpoints are the same, each call goes to
    :func:`checkpointing.checkpoint` instead of ``torch.utils.checkpoint.checkpoint``.
    Checkpointing runs only in training mode (``model.train()``), as in transformers.
    Turn it off with :func:`disable_gradient_checkpointing` or transformers' own
    ``gradient_checkpointing_disable()``; enabling transformers' checkpointing again
    brings back torch's function.

    Example::

        from checkpointing.integrations import enable_gradient_checkpointing

        enable_gradient_checkpointing(model)                       # non-reentrant
        enable_gradient_checkpointing(model, use_reentrant=True)   # reentrant

    Args:
        model: A transformers ``PreTrainedModel`` (or a wrapper that forwards its
            checkpointing methods, like a PEFT model). Changed in place.
        use_reentrant: ``False`` (default, as in transformers 5) for the non-reentrant
            variant, ``True`` for the reentrant one, which needs a layer input that
            requires grad (transformers arranges that for text models with
            ``enable_input_require_grads()``).
        preserve_rng_state: Replay the generator states in the recomputation, so
            dropout draws the same masks (default ``True``).
        backend: The backend or its name; ``None`` means :func:`accel.get_backend` at each call.
        **kwargs: More keywords for :func:`checkpointing.checkpoint` (non-reentrant
            only: ``context_fn``, ``determinism_check``).

    Raises:
        TypeError: ``model`` has no transformers checkpointing methods, or its code does
            not run its layers through ``_gradient_checkpointing_func`` (models written
            for transformers older than 4.35); checkpointing is left off.
        ValueError: From transformers, when the model does not support checkpointing.
    """
    enable = _method(model, "activation_checkpointing_enable", "gradient_checkpointing_enable")
    function = functools.partial(
        checkpoint,
        use_reentrant=use_reentrant,
        preserve_rng_state=preserve_rng_state,
        backend=backend,
        **kwargs,
    )
    enable({"use_reentrant": use_reentrant})
    layers = [module for module in model.modules() if _FUNC in vars(module)]
    if not layers:
        disable_gradient_checkpointing(model)
        raise TypeError(
            f"checkpointing.integrations: {type(model).__name__} enabled checkpointing without "
            f"setting {_FUNC} on any module, so its code calls torch.utils.checkpoint itself "
            "(a model written for transformers older than 4.35) and cannot use ours. "
            "Checkpointing was left off. Update the model's code, or wrap its layers with "
            "checkpointing.apply_activation_checkpointing."
        )
    for module in layers:
        setattr(module, _FUNC, function)


def disable_gradient_checkpointing(model: nn.Module) -> None:
    """Turn activation checkpointing off in a transformers model.

    The same as transformers' ``gradient_checkpointing_disable()`` (named
    ``activation_checkpointing_disable()`` since 5.x, which this calls where it exists),
    whichever checkpoint function was enabled.

    Args:
        model: A transformers ``PreTrainedModel``, changed in place.

    Raises:
        TypeError: ``model`` has no transformers checkpointing methods.
    """
    _method(model, "activation_checkpointing_disable", "gradient_checkpointing_disable")()
