"""Two-process DistributedDataParallel (gloo, CPU) with the reentrant checkpoint.

Each rank trains on half the batch; the gradients (two SGD steps) must match one
process training on the full batch, up to float rounding (``allclose`` with
``rtol=1e-5``): DDP averages two half-batch gradients where the single process
reduces over the whole batch at once, so the sums are ordered differently.

The test also pins down what DDP needs: a default DDP works when each parameter is
used in one checkpointed call; a parameter used in two reentrant checkpointed calls,
or ``find_unused_parameters=True``, makes DDP raise "Expected to mark a variable ready
only once" unless DDP is built with ``static_graph=True``; the non-reentrant
checkpoint needs neither.

Both ranks run as subprocesses of this test (MASTER_ADDR=127.0.0.1, a free port),
bounded by a timeout, and print their results as JSON.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
from accel_two_ranks import run_two_ranks  # loaded by tests/conftest.py

# Each test here starts processes or whole pytest sessions: deselected by default (see
# [tool.pytest.ini_options]).
pytestmark = pytest.mark.slow

TIMEOUT_S = 600  # for the whole fixture, retry included (a loaded 2-core CI machine)
REPO = Path(__file__).resolve().parents[2]

WORKER = textwrap.dedent(
    """
    import datetime, json, os, warnings
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from checkpointing import checkpoint

    warnings.simplefilter("ignore")  # DDP's own advice about static_graph
    torch.set_num_threads(1)


    class Net(nn.Module):
        def __init__(self, twice, reentrant):
            super().__init__()
            self.embed = nn.Linear(6, 8)
            self.block = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))
            self.head = nn.Linear(8, 2)
            self.twice = twice
            self.reentrant = reentrant

        def forward(self, x):
            h = checkpoint(self.block, self.embed(x), use_reentrant=self.reentrant)
            if self.twice:
                h = checkpoint(self.block, h, use_reentrant=self.reentrant)
            return self.head(h)


    def train(model, batches, ddp_kwargs=None):
        module = model if ddp_kwargs is None else DDP(model, **ddp_kwargs)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        grads = []
        for x in batches:
            optimizer.zero_grad()
            module(x).pow(2).mean().backward()
            grads.append([p.grad.clone() for p in model.parameters()])
            optimizer.step()
        return grads, [p.detach().clone() for p in model.parameters()]


    def close(a, b):
        return all(torch.allclose(x, y, rtol=1e-5, atol=1e-7) for x, y in zip(a, b))


    rank = int(os.environ["RANK"])
    dist.init_process_group(
        "gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=300)
    )
    generator = torch.Generator().manual_seed(3)
    full = [torch.randn(8, 6, generator=generator) for _ in range(2)]
    halves = [x[rank * 4 : (rank + 1) * 4] for x in full]
    cases = {
        "once": (False, True, {}),
        "once_find_unused": (False, True, {"find_unused_parameters": True}),
        "once_find_unused_static": (
            False, True, {"find_unused_parameters": True, "static_graph": True}
        ),
        "twice": (True, True, {}),
        "twice_static": (True, True, {"static_graph": True}),
        "twice_non_reentrant": (True, False, {}),
        "twice_non_reentrant_find_unused": (True, False, {"find_unused_parameters": True}),
    }
    results = {}
    for name, (twice, reentrant, ddp_kwargs) in cases.items():
        torch.manual_seed(0)
        reference = train(Net(twice, reentrant), full)
        torch.manual_seed(0)
        try:
            candidate = train(Net(twice, reentrant), halves, ddp_kwargs)
        except RuntimeError as error:
            results[name] = "error: " + str(error).splitlines()[0]
            continue
        grads_ok = all(close(a, b) for a, b in zip(candidate[0], reference[0]))
        params_ok = close(candidate[1], reference[1])
        results[name] = "equal" if grads_ok and params_ok else "different"
    dist.barrier()
    print("RESULTS " + json.dumps(results), flush=True)
    os._exit(0)  # without torch.distributed's teardown: see tests/two_ranks.py
    """
)


@pytest.fixture(scope="module")
def ddp_results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_two_ranks(WORKER, tmp_path_factory.mktemp("ddp"), TIMEOUT_S)


REQUIRES_STATIC_GRAPH = "error: Expected to mark a variable ready only once."


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("once", "equal"),
        ("once_find_unused", REQUIRES_STATIC_GRAPH),
        ("once_find_unused_static", "equal"),
        ("twice", REQUIRES_STATIC_GRAPH),
        ("twice_static", "equal"),
        ("twice_non_reentrant", "equal"),
        ("twice_non_reentrant_find_unused", "equal"),
    ],
)
def test_ddp_with_reentrant_checkpoint(
    ddp_results: list[dict[str, Any]], case: str, expected: str
) -> None:
    for rank, results in enumerate(ddp_results):
        outcome = results[case]
        if expected.startswith("error: "):
            assert outcome.startswith(expected), (rank, outcome)
        else:
            assert outcome == expected, (rank, outcome)
