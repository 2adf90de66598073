"""The demo's settings, variants and per-run results (shared by parent and children)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["BUDGET", "VARIANTS", "VOCAB", "DemoConfig", "RunResult"]

BUDGET = "checkpoint (budget 0.5)"
VARIANTS = ("plain", "checkpoint", "offload", BUDGET)
VOCAB = 256  # bytes


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
