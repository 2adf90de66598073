"""Double of ``habana_frameworks.torch.core.torch_overwrites``: the bridge's torch patches.

Each wrapper records ``"patched.<name>"`` and delegates to what it replaced, so the
double changes which functions torch exposes (as the bridge does) without changing
results; ``torch.manual_seed`` also seeds the hpu generator, and ``fork_rng`` defaults
to the hpu device, as in the bridge.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from habana_frameworks import _double

__all__ = ["apply"]


def _recording(
    name: str, original: Callable[..., Any], *, quiet: bool = False
) -> Callable[..., Any]:
    # quiet: called for every module attribute; recording each would flood CALLS.
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not quiet:
            _double.record(f"patched.{name}")
        return original(*args, **kwargs)

    return wrapper


def apply() -> None:
    """Patch torch as the bridge does on import (undone by ``_double.undo_process_changes``)."""
    from habana_frameworks.torch.hpu import random

    original_manual_seed = torch.manual_seed

    @functools.wraps(original_manual_seed)
    def manual_seed(seed: int) -> Any:
        _double.record("patched.manual_seed", seed)
        random.manual_seed(seed)
        return original_manual_seed(seed)

    original_fork_rng = torch.random.fork_rng

    @functools.wraps(original_fork_rng)
    def fork_rng(*args: Any, device_type: str = "hpu", **kwargs: Any) -> Any:
        _double.record("patched.fork_rng", device_type)
        return original_fork_rng(*args, device_type=device_type, **kwargs)

    _double.patch(torch, "manual_seed", manual_seed)
    _double.patch(torch, "seed", _recording("seed", torch.seed))
    _double.patch(torch.random, "fork_rng", fork_rng)
    _double.patch(
        torch.Tensor, "record_stream", _recording("record_stream", torch.Tensor.record_stream)
    )
    _double.patch(torch, "save", _recording("save", torch.save))
    _double.patch(torch, "load", _recording("load", torch.load))
    _double.patch(
        torch.nn.Module,
        "__setattr__",
        _recording("Module.__setattr__", torch.nn.Module.__setattr__, quiet=True),
    )
    _double.patch(
        torch.nn.Module,
        "add_module",
        _recording("Module.add_module", torch.nn.Module.add_module, quiet=True),
    )
    if dist.is_available():
        _double.patch(
            dist, "init_process_group", _recording("init_process_group", dist.init_process_group)
        )
        _double.patch(dist, "new_group", _recording("new_group", dist.new_group))
    # The bridge registers its device module as torch.hpu.
    from habana_frameworks.torch import hpu

    if not hasattr(torch, "hpu"):
        _double.patch(torch, "hpu", hpu)
        sys.modules["torch.hpu"] = hpu
