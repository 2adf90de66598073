"""``python -m accel demo``: one small GPT trained plain, checkpointed and offloaded.

Each run happens in a fresh process (so its peak RSS is its own) with the same seed and
data. The table shows step time, activation memory, peak RSS, the final loss, and
whether the first step's gradients equal the plain run's.
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

__all__ = ["DemoConfig", "RunResult", "add_arguments", "run_demo"]

VARIANTS = ("plain", "checkpoint", "offload")
_VOCAB = 256  # bytes
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


@dataclass(frozen=True)
class DemoConfig:
    """What the demo trains, and where."""

    steps: int = 30
    layers: int = 6
    width: int = 128
    heads: int = 4
    sequence: int = 64
    batch: int = 16
    seed: int = 0
    backend: str | None = None
    plot: str | None = None


@dataclass
class RunResult:
    """What one run measured."""

    variant: str
    backend: str
    step_seconds: list[float]
    losses: list[float]
    layer_memory: list[int]
    activation_bytes: int
    memory_kind: str
    peak_rss_bytes: int
    first_gradients: list[Any] = field(repr=False)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the demo's options to ``parser``."""
    defaults = DemoConfig()
    parser.add_argument("--steps", type=int, default=defaults.steps, help="training steps")
    parser.add_argument("--layers", type=int, default=defaults.layers, help="transformer blocks")
    parser.add_argument("--width", type=int, default=defaults.width, help="model width")
    parser.add_argument("--heads", type=int, default=defaults.heads, help="attention heads")
    parser.add_argument("--sequence", type=int, default=defaults.sequence, help="tokens per row")
    parser.add_argument("--batch", type=int, default=defaults.batch, help="rows per step")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="random seed")
    parser.add_argument("--backend", default=None, help="backend name (default: get_backend())")
    parser.add_argument("--plot", metavar="FILE.png", default=None, help="draw memory and loss")


def config_from(args: argparse.Namespace) -> DemoConfig:
    """Build a :class:`DemoConfig` from parsed arguments, rejecting impossible sizes."""
    config = DemoConfig(**{name: getattr(args, name) for name in DemoConfig.__dataclass_fields__})
    for name in ("steps", "layers", "width", "heads", "sequence", "batch"):
        if getattr(config, name) < 1:
            raise SystemExit(
                f"accel demo: --{name} must be at least 1, got {getattr(config, name)}."
            )
    if config.width % config.heads:
        raise SystemExit(
            f"accel demo: --width {config.width} is not divisible by --heads {config.heads}; "
            "pick a width that is a multiple of the head count."
        )
    return config


def run_demo(config: DemoConfig, out: TextIO = sys.stdout) -> list[RunResult]:
    """Train the three variants, print the table, draw the plot if asked; return results."""
    import accel

    backend_name = accel.get_backend(config.backend).name
    out.write(
        f"accel demo on backend {backend_name!r}: a {config.layers}-block GPT "
        f"(width {config.width}) trained {config.steps} steps, three ways\n"
    )
    out.flush()
    context = multiprocessing.get_context("spawn")
    results: list[RunResult] = []
    for variant in VARIANTS:
        with context.Pool(1) as pool:
            results.append(pool.apply(_train, (variant, config)))
    _print_table(results, out)
    if config.plot:
        _draw(results, config.plot)
        out.write(f"\nwrote {config.plot}\n")
    return results


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


def _prepare(variant: str, model: Any, backend: Any) -> Any:
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
    """Activation memory: device statistics where the backend has them, else saved bytes."""

    def __init__(self, backend: Any, parameters: list[Any]) -> None:
        from checkpointing import SavedTensorMeter

        self.backend = backend
        self.device_stats = bool(backend.supports_memory_stats)
        self.kind = "device peak" if self.device_stats else "autograd-saved tensors"
        self.saved = SavedTensorMeter(exclude=parameters)

    def current(self) -> int:
        return int(self.backend.memory_allocated()) if self.device_stats else self.saved.bytes

    def counting(self) -> Any:
        if self.device_stats:
            self.backend.reset_peak_memory_stats()
        return self.saved

    def peak(self) -> int:
        return int(self.backend.max_memory_allocated()) if self.device_stats else self.saved.bytes


def _train(variant: str, config: DemoConfig) -> RunResult:
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
    trained = _prepare(variant, model, backend)
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
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, _VOCAB), targets.reshape(-1))
        loss.backward()
        backend.mark_step()
        if step == 0:
            activation_bytes = meter.peak()
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


# Report -----------------------------------------------------------------------------


def _megabytes(value: int) -> str:
    return f"{value / 2**20:.1f} MiB"


def gradient_agreement(result: RunResult, reference: RunResult) -> str:
    """Say whether ``result``'s first gradients equal ``reference``'s, or how far apart."""
    import torch

    pairs = list(zip(result.first_gradients, reference.first_gradients, strict=True))
    if all(torch.equal(a, b) for a, b in pairs):
        return "yes (bit-exact)"
    difference = max(float((a - b).abs().max()) for a, b in pairs)
    return f"within {difference:.1e}" if difference < 1e-4 else f"NO (max diff {difference:.1e})"


def _print_table(results: Sequence[RunResult], out: TextIO) -> None:
    plain = results[0]
    headers = (
        "run",
        "step time",
        f"activations ({plain.memory_kind})",
        "peak RSS",
        "final loss",
        "grads = plain",
    )
    rows = [
        (
            result.variant,
            f"{statistics.median(result.step_seconds) * 1000:.1f} ms",
            _megabytes(result.activation_bytes),
            _megabytes(result.peak_rss_bytes),
            f"{result.losses[-1]:.4f}",
            "reference" if result is plain else gradient_agreement(result, plain),
        )
        for result in results
    ]
    table = [headers, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(headers))]
    out.write("\n")
    for index, row in enumerate(table):
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        out.write("\n")
        if index == 0:
            out.write("  ".join("-" * w for w in widths) + "\n")
    if plain.memory_kind == "autograd-saved tensors":
        out.write(
            "\nActivations: bytes autograd keeps for backward after the first forward "
            "(the host has no device\nmemory statistics). Offload keeps its slice inputs in "
            "host memory outside autograd, which\non the host is the same memory: compare "
            "peak RSS.\n"
        )


def _draw(results: Sequence[RunResult], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise SystemExit(
            "accel demo: --plot needs matplotlib, which is not installed; run "
            "`python -m pip install 'accel[demo]'` or drop --plot."
        ) from exc
    figure, (memory_axis, loss_axis) = plt.subplots(1, 2, figsize=(11, 4.2))
    for result, marker in zip(results, "osd", strict=False):
        layers = range(len(result.layer_memory))
        memory_axis.plot(
            layers, [m / 2**20 for m in result.layer_memory], marker=marker, label=result.variant
        )
        loss_axis.plot(
            range(1, len(result.losses) + 1),
            result.losses,
            marker=marker,
            markersize=3,
            label=result.variant,
        )
    memory_axis.set(
        title=f"Activation memory in the first forward\n({results[0].memory_kind})",
        xlabel="after layer (0 = embedding, last = head)",
        ylabel="MiB",
    )
    loss_axis.set(title="Training loss (identical curves: same math)", xlabel="step", ylabel="loss")
    for axis in (memory_axis, loss_axis):
        axis.grid(alpha=0.3)
        axis.legend()
    figure.suptitle(f"accel demo on {results[0].backend}")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
