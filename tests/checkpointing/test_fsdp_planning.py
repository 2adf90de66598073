"""Planning a model already sharded with FSDP2 (two gloo ranks on the CPU).

``fully_shard`` on each block and the root, then ``plan_checkpointing`` (at 0.5 and
0.2, and at 0.5 with a bfloat16 mixed-precision policy) and ``plan.apply``: two
training steps (SGD between them) must equal, bit for bit, those of the same sharded
model unplanned, on each rank. Planning runs no FSDP2 hook and
leaves nothing in FSDP2's state (the first real step would fail in
``fsdp.all_gather_copy_in`` otherwise). A sharded model that cannot run on fake
tensors (an LSTM inside) is refused, with the order to use instead, and so is one
whose FSDP2 hooks the planner cannot find (another torch's FSDP2).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from accel_two_ranks import run_two_ranks  # loaded by tests/conftest.py
from torch import nn

from accel._compat import FSDP2_MIN_RELEASE_OFF_CUDA, torch_release
from checkpointing import plan_checkpointing

FSDP2_ON_CPU = pytest.mark.skipif(
    torch_release() < FSDP2_MIN_RELEASE_OFF_CUDA,
    reason="FSDP2 runs on the CPU (gloo) from torch "
    f"{'.'.join(map(str, FSDP2_MIN_RELEASE_OFF_CUDA))}; older releases need CUDA",
)

WORKER = textwrap.dedent(
    """
    import datetime, json, os
    import torch
    import torch.distributed as dist
    from torch import nn
    import checkpointing
    from dataclasses import replace
    from checkpointing.planner import builtin_rates
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from accel.distributed import fully_shard

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    dist.init_process_group(
        "gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=120)
    )


    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.up = nn.Linear(16, 64)
            self.down = nn.Linear(64, 16)
            self.drop = nn.Dropout(0.1)
            self.norm = nn.LayerNorm(16)

        def forward(self, x):
            return x + self.drop(self.down(torch.relu(self.up(self.norm(x)))))


    def build(lstm=False, bf16=False):
        torch.manual_seed(0)
        kwargs = {}
        if bf16:  # gathers parameters in bfloat16, casts the inputs to it
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
        model = nn.Sequential(*(Block() for _ in range(4)), nn.Linear(16, 4))
        if lstm:
            model.insert(0, nn.LSTM(16, 16, batch_first=True))
        for block in model[:-1]:
            if isinstance(block, Block):
                fully_shard(block, **kwargs)
        fully_shard(model, **kwargs)
        return model


    def steps(model, x):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        results = []
        for step in range(2):
            torch.manual_seed(10 + step)
            loss = model(x).square().mean()
            loss.backward()
            grads = [p.grad.to_local().clone() for p in model.parameters()]
            results.append([loss.detach(), *grads])
            optimizer.step()
            optimizer.zero_grad()
        return results


    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(rank))
    # The saved grain's machinery priced at nothing, so that both grains are exercised
    # on the sharded blocks (tests/checkpointing/_grain_rates.py says why).
    free = replace(builtin_rates("cpu"), hook_seconds=0.0, replay_seconds=0.0, pack_bytes=1e15)
    exact, decisions, fits = True, set(), True
    for budget, bf16 in ((0.5, False), (0.2, False), (0.5, True)):
        planned, plain = build(bf16=bf16), build(bf16=bf16)
        plan = checkpointing.plan_checkpointing(planned, (x,), memory_budget=budget, rates=free)
        plan.apply(planned)
        got, expected = steps(planned, x), steps(plain, x)
        exact = exact and all(
            torch.equal(a, b) for one, two in zip(got, expected) for a, b in zip(one, two)
        )
        decisions |= set(plan.decisions.values())
        fits = fits and plan.estimated_bytes <= plan.budget_bytes
    try:
        checkpointing.plan_checkpointing(build(lstm=True), (x[:, None],), memory_budget=0.5)
        refused = ""
    except ValueError as error:
        refused = str(error)
    dist.barrier()
    result = {
        "exact": exact,
        "decisions": sorted(decisions),
        "fits": fits,
        "refused": refused,
    }
    print("RESULTS " + json.dumps(result), flush=True)
    os._exit(0)  # without torch.distributed's teardown: see tests/two_ranks.py
    """
)


@pytest.mark.slow  # starts two processes
@FSDP2_ON_CPU
def test_a_model_sharded_before_planning_trains_exactly(tmp_path: Path) -> None:
    results = run_two_ranks(WORKER, tmp_path, 300)
    for rank, result in enumerate(results):
        assert result["exact"], (rank, result)
        assert result["decisions"] == ["checkpoint", "recompute saved"], (rank, result)
        assert result["fits"], (rank, result)
        assert "Plan the model before sharding it" in result["refused"], (rank, result)


class _Sharded(nn.Linear):
    """Looks like an FSDP2 module whose torch registers its hooks in an unknown way."""

    def _get_fsdp_state(self) -> object:
        return object()


def test_fsdp2_hooks_the_planner_cannot_find_are_refused() -> None:
    model = nn.Sequential(_Sharded(4, 4), nn.Linear(4, 1))
    with pytest.raises(ValueError, match="Plan the model before sharding it"):
        plan_checkpointing(model, (torch.randn(2, 4),), memory_budget=0.5)
