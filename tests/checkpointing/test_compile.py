"""Under torch.compile our checkpoint is torch's: one graph, torch's results, bit for bit.

Each test compiles the same tiny model (dropout on) once with torch's checkpoint and
once with ours, with ``fullgraph=True`` (a graph break fails the test), and compares
outputs and gradients exactly: dynamo sees the same higher-order op either way.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.utils.checkpoint as torch_checkpoint
from torch import nn

import accel
from checkpointing import checkpoint, checkpoint_wrapper

BACKENDS = ["aot_eager", "inductor"]

# Raised inside torch while it compiles (inductor imports torch.jit helpers; dynamo reads
# .grad of traced tensors), with or without accel.
pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings(
        "ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning"
    ),
    pytest.mark.filterwarnings("ignore:Guards may run slower on Python 3.13.0:RuntimeWarning"),
]
MODES = [pytest.param(False, id="non_reentrant"), pytest.param(True, id="reentrant")]


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    # Compiled code and dynamo's caches must not outlive the test (torch 2.4 otherwise
    # changes how later, unrelated tests in the process run).
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    # Loading inductor's CPU kernels built with -ffast-math turns on flush-to-zero for the
    # whole process on torch 2.4 (denormals become 0 in every later test); turn it off.
    torch.set_flush_denormal(False)


def _model(dropout: float = 0.3) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Dropout(dropout), nn.Linear(8, 8))


def _input() -> torch.Tensor:
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(1)).requires_grad_()


def _run(
    compiled: Callable[[torch.Tensor], torch.Tensor], model: nn.Module
) -> tuple[torch.Tensor, ...]:
    x = _input()
    torch.manual_seed(2)
    out = compiled(x)
    out.backward()
    assert x.grad is not None
    return (out.detach(), x.grad, *(p.grad for p in model.parameters() if p.grad is not None))


def _compile(function: Callable[..., Any], backend: str) -> Callable[..., Any]:
    torch._dynamo.reset()
    return torch.compile(function, backend=backend, fullgraph=True)


def _same(ours: tuple[torch.Tensor, ...], theirs: tuple[torch.Tensor, ...]) -> bool:
    return len(ours) == len(theirs) and all(
        torch.equal(a, b) for a, b in zip(ours, theirs, strict=True)
    )


@pytest.mark.parametrize("reentrant", MODES)
@pytest.mark.parametrize("compile_backend", BACKENDS)
def test_checkpoint_compiles_to_torchs_graph(compile_backend: str, reentrant: bool) -> None:
    results = []
    for run in (torch_checkpoint.checkpoint, checkpoint):
        model = _model()

        def step(x: torch.Tensor, run: Callable[..., Any] = run, model: nn.Module = model) -> Any:
            return run(model, x, use_reentrant=reentrant).sum()

        results.append(_run(_compile(step, compile_backend), model))
    assert _same(results[1], results[0])


@pytest.mark.parametrize("reentrant", MODES)
def test_wrapped_model_compiles_in_one_graph(reentrant: bool) -> None:
    reference = _model()

    def theirs(x: torch.Tensor) -> torch.Tensor:
        hidden = torch_checkpoint.checkpoint(reference[0], x, use_reentrant=reentrant)
        return reference[1:](hidden).sum()

    ours = _model()
    ours[0] = checkpoint_wrapper(ours[0], use_reentrant=reentrant)
    expected = _run(_compile(theirs, "aot_eager"), reference)
    got = _run(_compile(lambda x: ours(x).sum(), "aot_eager"), ours)
    assert _same(got, expected)


def test_offload_to_cpu_runs_eagerly_under_compile() -> None:
    # A saved-tensor hook cannot be traced: that block runs outside the graph, same results.
    plain = _model(dropout=0.0)
    wrapped = copy.deepcopy(plain)
    wrapped[0] = checkpoint_wrapper(wrapped[0], offload_to_cpu=True)
    expected = _run(lambda x: plain(x).sum(), plain)
    compiled = torch.compile(lambda x: wrapped(x).sum(), backend="aot_eager")
    torch._dynamo.reset()
    got = _run(compiled, wrapped)
    assert len(got) == len(expected)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(got, expected, strict=True))


def test_compile_backend_of_the_backend_compiles() -> None:
    backend = accel.get_backend("cpu")
    model = _model().eval()
    x = _input().detach()
    compiled = torch.compile(model, backend=backend.compile_backend)
    torch._dynamo.reset()
    assert torch.allclose(compiled(x), model(x), atol=1e-6)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


def test_a_budget_plan_compiles_in_one_graph_and_trains_like_eager() -> None:
    from checkpointing import CheckpointPlan, Decision
    from checkpointing._decisions import FULL, SAVED
    from checkpointing.planner import builtin_rates, cost
    from checkpointing.planner._profile import profile_step
    from checkpointing.planner._saved_grain import saved_plan, saved_units

    torch.manual_seed(0)
    plain = nn.Sequential(*(_Block() for _ in range(4)))
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
    planned = copy.deepcopy(plain)
    profile = cost(profile_step(planned, (x,), accel.get_backend("cpu")), builtin_rates("cpu"))
    units = saved_units(profile, "1")[-1]
    plan = CheckpointPlan(
        choices={"0": Decision(FULL), "1": Decision(SAVED, saved_plan(profile, "1", units))},
        rows=(),
        plain_bytes=1,
        estimated_bytes=1,
        estimated_step_time_ratio=1.0,
        budget_bytes=1,
        step_seconds=1.0,
    )
    plan.apply(planned)
    compiled = _compile(lambda x: planned(x).square().sum(), "aot_eager")
    for _ in range(2):  # the second step runs the cached graph
        compiled(x).backward()
        plain(x).square().sum().backward()
        for ours, theirs in zip(planned.parameters(), plain.parameters(), strict=True):
            assert ours.grad is not None and theirs.grad is not None
            assert torch.allclose(ours.grad, theirs.grad, atol=1e-6)
            ours.grad = theirs.grad = None
