"""What checkpointing's own machinery costs on the device, timed for calibration.

:func:`selective_overhead` times a selective checkpoint's policy (per operator call it
sees, and per call it keeps) on a small chain of layers, with :mod:`._stopwatch`, only
for :func:`._calibrate.calibrate_rates`. The saved-tensor grain's machinery is timed in
:mod:`._saved_machinery`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from accel import Accelerator

from ..._checkpoint import run_checkpoint
from ..._non_reentrant import ContextFn
from ..._selective import kept_calls_context_fn
from ._stopwatch import SIZES, Sizes, best_times

__all__ = ["region_overhead", "selective_overhead"]


_LAYERS = 4  # layers of the chain selective_overhead times
_REGIONS = 8  # module calls region_overhead checkpoints, each on its own
_SHALLOW, _DEEP = 2, 18  # tensors each of those calls saves, in its two chains


class _Chain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(_LAYERS):
            hidden = nn.functional.gelu(self.linear(self.norm(x)))
            hidden = nn.functional.dropout(hidden, 0.1, training=True)
            x = x + hidden.reshape(2, 2, 8).transpose(0, 1).reshape(4, 8)
        return x


class _Small(nn.Module):
    """A module call that saves ``depth`` tensors for backward, and little work besides."""

    def __init__(self, depth: int) -> None:
        super().__init__()
        self.depth = depth

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.depth):
            x = torch.tanh(x)  # saves its output
        return x


class _Counter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.calls.append(str(func))
        return func(*args, **(kwargs or {}))


def selective_overhead(backend: Accelerator, sizes: Sizes = SIZES) -> tuple[float, float]:
    """Seconds per operator call, and extra seconds per kept call, of a selective policy.

    Args:
        backend: The backend the model runs on; its generators are left as they were.
        sizes: How many rounds to time.

    Returns:
        ``(per_call, per_kept_call)``, both at least 0.
    """
    with backend.fork_rng():
        chain = _Chain().to(backend.device())
        x = torch.ones(4, 8, device=backend.device(), requires_grad=True)
        counter = _Counter()
        with counter:
            chain(x)
        seen: dict[str, int] = {}
        every = []
        for name in counter.calls:
            every.append((name, seen.get(name, 0)))
            seen[name] = seen.get(name, 0) + 1
        calls = len(every)

        def run(context_fn: ContextFn | None, checkpointed: bool = True) -> None:
            if checkpointed:
                out = run_checkpoint(
                    chain, (x,), {}, use_reentrant=False, backend=backend, context_fn=context_fn
                )
            else:
                out = chain(x)
            out.sum().backward()

        keep_none, keep_all = kept_calls_context_fn(()), kept_calls_context_fn(every)
        run(keep_all)  # warm-up: first calls build caches
        plain, full, none, kept = best_times(
            [
                lambda: run(None, checkpointed=False),
                lambda: run(None),
                lambda: run(keep_none),
                lambda: run(keep_all),
            ],
            backend,
            sizes,
        )
    per_call = max(none - full, 0.0) / calls
    per_kept = max((kept - plain) / calls - per_call, 0.0)
    return per_call, per_kept


def region_overhead(backend: Accelerator, sizes: Sizes = SIZES) -> tuple[float, float]:
    """Seconds a checkpointed module call costs beyond recomputing its forward.

    Times a chain of small module calls, each checkpointed on its own, against the same
    chain unwrapped and against its forward alone, interleaved: what is left per call is
    the checkpoint's machinery (frames and hooks in the forward, the unpack that starts
    the recomputation, the generator states kept and restored, and a hook in the
    forward, in the recomputation and in backward for every tensor the call saves). On
    a CPU it is a few hundred operator calls' worth, which the operators' own prices
    never see. Two chains, whose calls save 2 and 18 tensors, split it into a cost per
    call and one per saved tensor.

    Args:
        backend: The backend the chain runs on; its generators are left as they were.
        sizes: How many rounds to time.

    Returns:
        Seconds per checkpointed call, and per tensor it saves; each at least 0.
    """
    shallow = _region_seconds(backend, sizes, _SHALLOW)
    deep = _region_seconds(backend, sizes, _DEEP)
    per_tensor = max(deep - shallow, 0.0) / (_DEEP - _SHALLOW)
    return max(shallow - _SHALLOW * per_tensor, 0.0), per_tensor


def _region_seconds(backend: Accelerator, sizes: Sizes, depth: int) -> float:
    """Seconds per checkpointed call of a chain whose calls each save ``depth`` tensors."""
    with backend.fork_rng():
        device = backend.device()
        chain = [_Small(depth).to(device) for _ in range(_REGIONS)]
        x = torch.ones(4, 8, device=device, requires_grad=True)

        def step(checkpointed: bool) -> None:
            hidden = x
            for module in chain:
                hidden = (
                    run_checkpoint(module, (hidden,), {}, use_reentrant=False, backend=backend)
                    if checkpointed
                    else module(hidden)
                )
            hidden.sum().backward()

        def forward() -> None:
            hidden = x
            for module in chain:
                hidden = module(hidden)

        plain, checkpointed, ahead = best_times(
            [lambda: step(False), lambda: step(True), forward], backend, sizes
        )
    return max(checkpointed - plain - ahead, 0.0) / _REGIONS
