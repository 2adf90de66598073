"""``benchmarks/try_families.py`` on two of its families: a decoder and Reformer.

Reformer's reversible layers run a backward of their own in backward, which wrote fake
gradients into the real parameters while planning; the script's run of all 29 families
is in ``docs/memory-budget-planning.md``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _benchmarks_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))


@pytest.mark.parametrize("family", ["opt", "reformer"])
def test_a_family_plans_trains_exactly_and_leaves_a_second_instance_working(
    family: str,
) -> None:
    pytest.importorskip("transformers")
    from try_families import try_family

    seed = torch.seed
    found = try_family(family, 0.5)
    assert torch.seed is seed  # Reformer's fixed seed is undone
    assert found["error"] is None, found["error"]
    assert found["exact"] and found["exact_again"], found
    assert not found["over_budget"] and found["measured_ratio"] <= 0.52, found
