"""The demo's training run, one per child process: model, data, variants, measurements."""

from __future__ import annotations

import resource
import sys
import time
import warnings
from collections.abc import Iterator
from typing import Any, TextIO

from ._demo_config import BUDGET, DemoConfig, RunResult
from ._demo_config import VOCAB as _VOCAB

__all__ = ["quiet_child", "train"]

_CORPUS = """\
The same training code should run on every accelerator. A model is moved to the device
the backend names, the generator is seeded through the backend, and the lazy graph of a
Gaudi card is flushed where the backend says it must be. Activation checkpointing trades
a second forward pass for memory: only the inputs of each block are kept, and the block
is recomputed during backward with the random state it first saw, so dropout draws the
same masks and the gradients come out bit for bit the same. Offload goes further and
keeps the parameters themselves in host memory, bringing one slice at a time to the
device while the next one is already on its way.
"""


def quiet_child() -> None:
    """Silence torch's "Failed to initialize NumPy" warning in a demo child process.

    torch warns once per process at import when numpy is missing (a minimal install);
    the demo needs no numpy, and four children would print it four times.
    """
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)


# The model -------------------------------------------------------------------------


def _build_model(config: DemoConfig) -> Any:
    import torch
    from torch import nn

    class Embed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tokens = nn.Embedding(_VOCAB, config.width)
            self.positions = nn.Parameter(torch.zeros(config.sequence, config.width))
            self.dropout = nn.Dropout(0.1)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.dropout(self.tokens(ids) + self.positions[: ids.shape[1]])

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1 = nn.LayerNorm(config.width)
            self.attention = nn.MultiheadAttention(
                config.width, config.heads, dropout=0.1, batch_first=True
            )
            self.norm2 = nn.LayerNorm(config.width)
            self.mlp = nn.Sequential(
                nn.Linear(config.width, 4 * config.width),
                nn.GELU(),
                nn.Linear(4 * config.width, config.width),
                nn.Dropout(0.1),
            )

        def forward(self, hidden: torch.Tensor) -> torch.Tensor:
            length = hidden.shape[1]
            causal = torch.ones(length, length, dtype=torch.bool, device=hidden.device).triu(1)
            normed = self.norm1(hidden)
            attended, _ = self.attention(
                normed, normed, normed, attn_mask=causal, need_weights=False
            )
            hidden = hidden + attended
            return hidden + self.mlp(self.norm2(hidden))

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(config.width)
            self.out = nn.Linear(config.width, _VOCAB)

        def forward(self, hidden: torch.Tensor) -> torch.Tensor:
            return self.out(self.norm(hidden))

    return nn.Sequential(Embed(), *[Block() for _ in range(config.layers)], Head())


def _corpus() -> Any:
    import torch

    return torch.tensor(list((_CORPUS * 4).encode()), dtype=torch.long)


def _batches(config: DemoConfig) -> Iterator[tuple[Any, Any]]:
    import torch

    corpus = _corpus()
    generator = torch.Generator().manual_seed(config.seed)
    while True:
        starts = torch.randint(
            len(corpus) - config.sequence - 1, (config.batch,), generator=generator
        )
        rows = torch.stack([corpus[s : s + config.sequence + 1] for s in starts.tolist()])
        yield rows[:, :-1], rows[:, 1:]


def _prepare(variant: str, model: Any, backend: Any, config: DemoConfig) -> Any:
    if variant == BUDGET:
        from checkpointing import apply_activation_checkpointing

        ids, _ = next(_batches(config))
        model = model.to(backend.device())
        apply_activation_checkpointing(
            model,
            memory_budget=0.5,
            example_inputs=(ids.to(backend.device()),),
            backend=backend,
        )
        return model
    if variant == "checkpoint":
        from checkpointing import apply_activation_checkpointing

        blocks = tuple(type(layer) for layer in list(model)[1:-1])
        apply_activation_checkpointing(
            model, check_fn=lambda m: isinstance(m, blocks), use_reentrant=True, backend=backend
        )
        return model.to(backend.device())
    if variant == "offload":
        from offload import OffloadModel

        return OffloadModel(model, num_slices=3, checkpoint_activation=True, backend=backend)
    return model.to(backend.device())


# One run, in a child process ------------------------------------------------------------


class _MemoryMeter:
    """Activation memory: device statistics where the backend has them, else live tensors.

    On the host, the bytes of the tensors created in the forward and still alive: what
    autograd saves, what a selective checkpoint keeps outside autograd, and the
    current output.
    """

    def __init__(self, backend: Any, parameters: list[Any]) -> None:
        from checkpointing import LiveActivationMeter

        self.backend = backend
        self.device_stats = bool(backend.supports_memory_stats)
        self.kind = "device peak" if self.device_stats else "live tensors after forward"
        self.live = LiveActivationMeter(exclude=parameters)

    def current(self) -> int:
        return int(self.backend.memory_allocated()) if self.device_stats else self.live.bytes

    def counting(self) -> Any:
        if self.device_stats:
            self.backend.reset_peak_memory_stats()
        return self.live

    def peak(self) -> int:
        return int(self.backend.max_memory_allocated()) if self.device_stats else self.live.bytes


def train(variant: str, config: DemoConfig) -> RunResult:
    """Train ``variant`` of the demo model and measure it (runs in a child process)."""
    import torch

    import accel

    backend = accel.get_backend(config.backend)
    torch.manual_seed(config.seed)
    backend.manual_seed(config.seed)
    model = _build_model(config)
    parameters = list(model.parameters())
    meter = _MemoryMeter(backend, parameters)
    layer_memory: list[int] = []
    hooks = [
        layer.register_forward_hook(lambda *_: layer_memory.append(meter.current()))
        for layer in model
    ]
    trained = _prepare(variant, model, backend, config)
    layer_memory.clear()  # planning a budget runs the model; only training steps count
    optimizer = torch.optim.AdamW(parameters, lr=3e-3)
    batches = _batches(config)
    losses: list[float] = []
    seconds: list[float] = []
    first_gradients: list[Any] = []
    activation_bytes = 0
    for step in _progress(range(config.steps), variant):
        ids, targets = (t.to(backend.device()) for t in next(batches))
        start = time.perf_counter()
        with meter.counting():
            logits = trained(ids)
        # On the host, what the forward holds is read before backward frees it.
        forward_bytes = None if meter.device_stats else meter.current()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, _VOCAB), targets.reshape(-1))
        loss.backward()
        backend.mark_step()
        if step == 0:
            activation_bytes = forward_bytes if forward_bytes is not None else meter.peak()
            first_gradients = [p.grad.detach().to("cpu", copy=True) for p in parameters]
            for hook in hooks:
                hook.remove()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        backend.mark_step()
        backend.synchronize()
        seconds.append(time.perf_counter() - start)
        losses.append(float(loss.detach().cpu()))
    return RunResult(
        variant=variant,
        backend=backend.name,
        step_seconds=seconds,
        losses=losses,
        layer_memory=layer_memory[: len(model)],
        activation_bytes=activation_bytes,
        memory_kind=meter.kind,
        peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        first_gradients=first_gradients,
    )


def _progress(steps: range, label: str, out: TextIO = sys.stderr) -> Iterator[int]:
    width = 30
    start = time.perf_counter()
    for step in steps:
        yield step
        done = step + 1
        filled = width * done // len(steps)
        elapsed = time.perf_counter() - start
        out.write(
            f"\r{label:<10} [{'#' * filled}{'.' * (width - filled)}] {done}/{len(steps)} "
            f"{elapsed:5.1f}s"
        )
        out.flush()
    out.write("\n")
