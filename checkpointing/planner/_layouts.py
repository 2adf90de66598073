"""Fake tensors laid out as the device's kernels lay them out.

The saved-tensor grain plans on the exact views the fake step saved (shape, strides,
offset), and which operators a module runs can follow the strides (a linear layer
on a non-contiguous input copies it first: ``clone`` and ``mm``, not ``addmm``). So a
fake tensor whose strides differ from the real one's gives the module other saved
tensors and other operator calls than its real step.

Batch normalisation is such a case on the CPU: torch's CPU kernel writes its output
contiguously (channels-last where the input is channels-last), whatever the input's
strides, while its fake kernel keeps the input's strides (pytorch/pytorch#192668,
open on torch 2.13). A batch norm over a transposed input, as time-series models
normalise their channels (transformers' PatchTST), then feeds its next layer a
transposed tensor in the profile and a contiguous one in the real step.

:class:`DeviceLayouts` is a dispatch mode that runs under the profile's recorder and
above the fake-tensor mode: it gives the outputs of such operators the layout the
device's kernel gives them. It also makes the outputs of a grouped matrix product
(``aten._grouped_mm``, transformers' mixture-of-experts experts) in float32, which the
device's kernel computes and some releases' fake kernel refuses
(:func:`accel._compat.grouped_mm_fake_output`). Only what is known to differ is
corrected; the saved-tensor wrapper checks every saved tensor and recomputation against
the plan on its first real call (:mod:`checkpointing._saved_verify`), which catches any
other difference.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from accel._compat import grouped_mm_fake_output

__all__ = ["DeviceLayouts"]

# Batch norm forward operators, whose first output the CPU kernel lays out by
# ``suggest_memory_format`` (aten/src/ATen/native/Normalization.cpp, batch_norm_cpu).
_BATCH_NORMS = frozenset(
    {
        "aten::native_batch_norm",
        "aten::_native_batch_norm_legit",
        "aten::_native_batch_norm_legit_no_training",
        "aten::_batch_norm_with_update",
        "aten::_batch_norm_no_update",
    }
)


_GROUPED_MM = "aten::_grouped_mm"


def _channels_last_order(tensor: torch.Tensor) -> bool:
    """Whether the strides order the dimensions as channels-last does (N, then H.., C)."""
    order = [0, *range(2, tensor.dim()), 1]  # outermost to innermost
    strides = [tensor.stride(d) for d in order if tensor.size(d) > 1]
    return strides == sorted(strides, reverse=True) and len(set(strides)) == len(strides)


def _cpu_batch_norm_format(tensor: torch.Tensor) -> torch.memory_format:
    """The memory format of the CPU batch norm kernel's output for ``tensor``."""
    formats = {4: torch.channels_last, 5: torch.channels_last_3d}
    channels_last = formats.get(tensor.dim())
    if tensor.is_contiguous() or channels_last is None:
        return torch.contiguous_format
    if tensor.is_contiguous(memory_format=channels_last) or _channels_last_order(tensor):
        return channels_last
    return torch.contiguous_format


class DeviceLayouts(TorchDispatchMode):
    """Gives operator outputs the strides the device's kernels give them (module docstring)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        schema = getattr(func, "_schema", None)
        if schema is not None and schema.name == _GROUPED_MM:
            return _grouped_mm_of(func, args, kwargs or {})
        out = func(*args, **(kwargs or {}))
        if schema is None or schema.name not in _BATCH_NORMS:
            return out
        source = args[0]
        if source.device.type != "cpu":
            # A GPU's kernel keeps the input's layout, as the fake kernel does; any other
            # difference is caught by the saved-tensor wrapper's first-call check.
            return out
        fmt = _cpu_batch_norm_format(source)
        first = out[0]
        if first.is_contiguous(memory_format=fmt):
            return out
        laid_out = torch.empty(
            first.shape, dtype=first.dtype, device=first.device, memory_format=fmt
        )
        return (laid_out, *out[1:])


def _grouped_mm_of(func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    """The fake kernel's output, else, where it refuses the inputs, the device's shape."""
    # The fake-tensor mode logs a refused call with its traceback before raising.
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        return func(*args, **kwargs)
    except RuntimeError:
        return _grouped_mm(*args, **kwargs)
    finally:
        logger.setLevel(level)


def _grouped_mm(
    first: torch.Tensor,
    second: torch.Tensor,
    offs: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """A grouped product's output where the fake kernel refused the inputs' dtype.

    Only for inputs the device's kernel takes (matching floating dtypes, no bias);
    anything else is refused with a sentence naming the dtypes.
    """
    if first.dtype != second.dtype or not first.is_floating_point() or bias is not None:
        raise RuntimeError(
            "checkpointing: the fake step cannot run aten._grouped_mm on "
            f"{first.dtype} x {second.dtype} inputs; the profile needs the device to "
            "take them."
        )
    return grouped_mm_fake_output(first, second, offs, out_dtype)
