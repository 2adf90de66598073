"""Checkpointing to a memory budget: activation memory against step time.

Two models on the selected backend: the transformer stack of ``bench_checkpoint.py``
and, when transformers is installed, a GPT-2-shaped model built from transformers'
``GPT2Config`` (random weights). For each, these variants train on the same data:

* ``plain``: no checkpointing;
* ``budget 1.0``, ``budget 0.75``, ``budget 0.5``, ``budget 0.25``:
  ``apply_activation_checkpointing(model, memory_budget=b, example_inputs=...)``;
* ``full``: ours, every block checkpointed (``check_fn`` on the block class);
* ``torch per-block``: ``torch.utils.checkpoint.checkpoint`` on every block
  (non-reentrant);
* ``torch selective``: the same with torch's selective policy "save matmuls (mm,
  addmm, bmm, baddbmm), recompute the rest" (torch 2.5 and later).

Measures:
* activation bytes: the bytes of the tensors the model's forward created that are
  still alive at its end, its output and parameters excluded (``LiveActivationMeter``:
  autograd's saved tensors and what a selective policy keeps outside autograd; the
  planner's own measure); on a backend with
  memory statistics also the device's peak allocation of a step above what was
  allocated before it;
* step time: median over ``--steps`` rounds after ``--warmup``; each round runs one
  step of every variant in a rotating order, and ratios are medians of per-round
  ratios to ``plain``; the backend is synchronized before each timer read.

Targets (reported, not asserted): at budget 0.5, activation bytes <= 0.5x and step
time <= 1.15x plain; every budget no slower than the fastest of torch's per-block and
selective variants that use no more memory.

Usage: python benchmarks/bench_budget.py [--backend NAME] [--model stack|gpt2|all]
       [--warmup N] [--steps N] [--threads N] [--plot FILE.png]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.checkpoint
from _report import print_table, write_results
from bench_checkpoint import Stack
from torch import nn

import accel
from accel import Accelerator
from accel._compat import selective_checkpoint_api
from checkpointing import apply_activation_checkpointing
from checkpointing._measure import LiveActivationMeter

BUDGETS = (1.0, 0.75, 0.5, 0.25)
TARGET_BYTES, TARGET_TIME = 0.5, 1.15
TORCH_VARIANTS = ("torch per-block", "torch selective")


class StackModel(nn.Module):
    """``bench_checkpoint``'s stack, called with one tensor."""

    def __init__(self, config: dict[str, int]) -> None:
        super().__init__()
        self.stack = Stack(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stack(x, lambda block, hidden: block(hidden))


class TorchCheckpoint(nn.Module):
    """Runs a block through ``torch.utils.checkpoint.checkpoint`` (non-reentrant)."""

    def __init__(self, block: nn.Module, context_fn: Callable[[], Any] | None) -> None:
        super().__init__()
        self.block = block
        self.context_fn = context_fn

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        extra = {} if self.context_fn is None else {"context_fn": self.context_fn}
        return torch.utils.checkpoint.checkpoint(
            self.block, *args, use_reentrant=False, **extra, **kwargs
        )


def save_matmuls() -> Callable[[], Any] | None:
    api = selective_checkpoint_api()
    if isinstance(api, str):
        return None
    create, policy = api
    aten = torch.ops.aten
    matmuls = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}

    def choose(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        return policy.MUST_SAVE if func in matmuls else policy.PREFER_RECOMPUTE

    return lambda: create(choose)


class Case:
    """A model, its blocks' container, its inputs and its loss."""

    def __init__(self, name: str, backend: Accelerator) -> None:
        self.name = name
        device = backend.device()
        torch.manual_seed(0)
        generator = torch.Generator().manual_seed(1)
        if name == "stack":
            config = dict(d_model=256, heads=4, ffn=1024, layers=4, seq=128, batch=8)
            config["dropout_percent"] = 10
            self.model: nn.Module = StackModel(config)
            self.blocks: nn.ModuleList = self.model.stack.blocks
            shape = (config["batch"], config["seq"], config["d_model"])
            self.inputs: tuple[Any, ...] = (torch.randn(*shape, generator=generator).to(device),)
            self.target = torch.randn(*shape, generator=generator).to(device)
        else:
            from transformers import GPT2Config, GPT2LMHeadModel

            gpt = GPT2Config(
                n_layer=4,
                n_embd=256,
                n_head=4,
                n_positions=128,
                vocab_size=2048,
                bos_token_id=0,
                eos_token_id=0,
                use_cache=False,
            )
            self.model = GPT2LMHeadModel(gpt)
            self.blocks = self.model.transformer.h
            ids = torch.randint(gpt.vocab_size, (4, 128), generator=generator).to(device)
            self.inputs = (ids,)
            self.target = ids
        self.model.to(device).train()

    def loss(self, model: nn.Module) -> torch.Tensor:
        return self.loss_of(model(*self.inputs))

    def loss_of(self, out: Any) -> torch.Tensor:
        if self.name == "stack":
            return nn.functional.mse_loss(out, self.target)
        logits = out.logits
        return nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), self.target.reshape(-1)
        )

    def variant(self, name: str, backend: Accelerator) -> tuple[nn.Module, str]:
        """A fresh copy of the model set up as ``name``, and its plan's table."""
        model = copy.deepcopy(self.model)
        blocks = model.get_submodule(self._blocks_name())
        table = ""
        if name.startswith("budget"):
            from checkpointing import plan_checkpointing

            plan = plan_checkpointing(model, self.inputs, float(name.split()[1]), backend=backend)
            plan.apply(model, backend=backend)
            table = str(plan)
        elif name == "full":
            kind = type(self.blocks[0])
            apply_activation_checkpointing(
                model, check_fn=lambda m: isinstance(m, kind), backend=backend
            )
        elif name in TORCH_VARIANTS:
            context_fn = save_matmuls() if name == "torch selective" else None
            for index, block in enumerate(list(blocks)):
                blocks[index] = TorchCheckpoint(block, context_fn)
        return model, table

    def _blocks_name(self) -> str:
        for name, module in self.model.named_modules():
            if module is self.blocks:
                return name
        raise LookupError("blocks not found")


def live_bytes(case: Case, model: nn.Module) -> int:
    """What the model's forward holds for backward: live tensors it created, output aside."""
    with LiveActivationMeter(exclude=[*model.parameters(), *model.buffers()]) as meter:
        out = model(*case.inputs)
    outputs = out if isinstance(out, torch.Tensor) else out.logits
    held = meter.bytes - outputs.untyped_storage().nbytes()
    loss = case.loss_of(out)
    loss.backward()
    model.zero_grad(set_to_none=True)
    return held


def step(case: Case, model: nn.Module, backend: Accelerator) -> float:
    backend.synchronize()
    start = time.perf_counter()
    case.loss(model).backward()
    backend.mark_step()
    backend.synchronize()
    elapsed = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    return elapsed


def device_peak(case: Case, model: nn.Module, backend: Accelerator) -> int | None:
    if not backend.supports_memory_stats:
        return None
    backend.synchronize()
    before = backend.memory_allocated()
    backend.reset_peak_memory_stats()
    step(case, model, backend)
    return backend.max_memory_allocated() - before


def run_case(name: str, backend: Accelerator, args: argparse.Namespace) -> dict[str, Any]:
    case = Case(name, backend)
    variants = ["plain", *(f"budget {b}" for b in BUDGETS), "full", "torch per-block"]
    if save_matmuls() is not None:
        variants.append("torch selective")
    models: dict[str, nn.Module] = {}
    plans: dict[str, str] = {}
    for variant in variants:
        models[variant], plans[variant] = case.variant(variant, backend)
    held = {variant: live_bytes(case, models[variant]) for variant in variants}
    peaks = {variant: device_peak(case, models[variant], backend) for variant in variants}
    for _ in range(args.warmup):
        for variant in variants:
            step(case, models[variant], backend)
    times: dict[str, list[float]] = {variant: [] for variant in variants}
    for round_index in range(args.steps):
        shift = round_index % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            times[variant].append(step(case, models[variant], backend))
    rows = {}
    for variant in variants:
        ratio = statistics.median(
            a / b for a, b in zip(times[variant], times["plain"], strict=True)
        )
        rows[variant] = {
            "activation_bytes": held[variant],
            "bytes_ratio": held[variant] / held["plain"],
            "device_peak_bytes": peaks[variant],
            "step_seconds": statistics.median(times[variant]),
            "time_ratio": ratio,
        }
    for variant, row in rows.items():
        row["pareto"] = not any(
            other["bytes_ratio"] <= row["bytes_ratio"] and other["time_ratio"] < row["time_ratio"]
            for name_, other in rows.items()
            if name_ != variant
        )
        if variant.startswith("budget"):
            rivals = [
                rows[t]["time_ratio"]
                for t in TORCH_VARIANTS
                if t in rows and rows[t]["bytes_ratio"] <= row["bytes_ratio"]
            ]
            row["vs_torch"] = None if not rivals else bool(row["time_ratio"] <= min(rivals))
    half = rows["budget 0.5"]
    return {
        "model": name,
        "variants": rows,
        "plans": {k: v for k, v in plans.items() if v},
        "target_at_half": bool(
            half["bytes_ratio"] <= TARGET_BYTES and half["time_ratio"] <= TARGET_TIME
        ),
    }


def print_case(result: dict[str, Any]) -> None:
    print(f"\n{result['model']}: activation memory against step time (ratios to plain)")
    rows = []
    for variant, row in sorted(result["variants"].items(), key=lambda item: item[1]["bytes_ratio"]):
        vs_torch = row.get("vs_torch")
        rows.append(
            (
                variant,
                f"{row['activation_bytes'] / 2**20:.1f} MiB",
                f"{row['bytes_ratio']:.2f}x",
                f"{row['step_seconds'] * 1e3:.1f} ms",
                f"{row['time_ratio']:.2f}x",
                "yes" if row["pareto"] else "",
                "-" if vs_torch is None else ("yes" if vs_torch else "NO"),
            )
        )
    print_table(
        ("variant", "activations", "memory", "step", "time", "Pareto", "<= torch at <= memory"),
        rows,
    )
    verdict = "met" if result["target_at_half"] else "NOT met"
    print(f"target at budget 0.5 (<= {TARGET_BYTES}x memory, <= {TARGET_TIME}x time): {verdict}")


def draw(results: list[dict[str, Any]], path: str, backend: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(results), figsize=(6.5 * len(results), 5), squeeze=False)
    for axis, result in zip(axes[0], results, strict=True):
        rows = result["variants"]
        ours = sorted(
            (r["bytes_ratio"], r["time_ratio"])
            for v, r in rows.items()
            if v.startswith("budget") or v in ("plain", "full")
        )
        axis.plot(*zip(*ours, strict=True), color="C0", alpha=0.4)
        for variant, row in rows.items():
            colour = "C1" if variant.startswith("torch") else "C0"
            marker = "s" if variant.startswith("torch") else "o"
            axis.scatter(row["bytes_ratio"], row["time_ratio"], color=colour, marker=marker)
            axis.annotate(
                variant,
                (row["bytes_ratio"], row["time_ratio"]),
                textcoords="offset points",
                xytext=(5, 4),
                fontsize=8,
            )
        axis.axvline(TARGET_BYTES, color="grey", linestyle=":", linewidth=1)
        axis.axhline(TARGET_TIME, color="grey", linestyle=":", linewidth=1)
        axis.set(
            title=f"{result['model']} (blue: accel, orange: torch)",
            xlabel="activation memory / plain",
            ylabel="step time / plain",
        )
        axis.grid(alpha=0.3)
    figure.suptitle(f"Checkpointing to a memory budget on {backend} (lower left is better)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default=None, help="backend name (default: auto)")
    parser.add_argument("--model", choices=("stack", "gpt2", "all"), default="all")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds")
    parser.add_argument("--steps", type=int, default=5, help="timed rounds")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's)")
    parser.add_argument("--plot", metavar="FILE.png", default=None, help="draw the Pareto plot")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    backend = accel.get_backend(args.backend)
    names = ["stack", "gpt2"] if args.model == "all" else [args.model]
    if "gpt2" in names:
        try:
            import transformers  # noqa: F401
        except ImportError:
            print("transformers is not installed: the GPT-2-shaped model is skipped")
            names.remove("gpt2")
    started = time.perf_counter()
    results = []
    for name in names:
        result = run_case(name, backend, args)
        print_case(result)
        print(f"\nplan at budget 0.5:\n{result['plans']['budget 0.5']}")
        results.append(result)
    seconds = time.perf_counter() - started
    path = write_results(
        "budget",
        backend.name,
        {"warmup": args.warmup, "steps": args.steps, "seconds": seconds, "models": results},
    )
    print(f"\n{seconds:.0f} s; wrote {path}")
    if args.plot:
        draw(results, args.plot, backend.name)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
