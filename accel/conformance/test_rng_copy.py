"""Generator states are copies: nothing the backend does later changes a returned state."""

from __future__ import annotations

import torch

from accel import Accelerator
from accel.conformance import rule


def _share_memory(first: torch.Tensor, second: torch.Tensor) -> bool:
    if first.numel() == 0 or second.numel() == 0:
        return False
    return bool(first.untyped_storage().data_ptr() == second.untyped_storage().data_ptr())


def test_rng_state_is_a_copy(accel_backend: Accelerator) -> None:
    accel_backend.manual_seed(21)
    saved = accel_backend.get_rng_state()
    snapshot = saved.clone()
    assert not _share_memory(saved, accel_backend.get_rng_state()), rule(
        "rng-copy", "two get_rng_state() calls returned tensors sharing memory (the live state)"
    )

    with accel_backend.fork_rng():
        accel_backend.manual_seed(22)
        accel_backend.set_rng_state(accel_backend.get_rng_state())

    # Whether fork_rng restored the generator is rule fork-rng's business.
    assert torch.equal(saved, snapshot), rule(
        "rng-copy", "a state returned before fork_rng changed when a state was set inside it"
    )
