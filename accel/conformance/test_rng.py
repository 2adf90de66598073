"""Generator state: round trips, seeding, fork_rng, dropout masks."""

from __future__ import annotations

import pytest
import torch

from accel import Accelerator
from accel.conformance import rule


class _Boom(Exception):
    pass


def test_state_roundtrip(accel_backend: Accelerator) -> None:
    state = accel_backend.get_rng_state()
    assert isinstance(state, torch.Tensor) and state.dtype == torch.uint8, rule(
        "rng-roundtrip", f"get_rng_state() returned {type(state).__name__}, not a uint8 tensor"
    )
    accel_backend.manual_seed(1234)
    accel_backend.set_rng_state(state)
    assert torch.equal(accel_backend.get_rng_state(), state), rule(
        "rng-roundtrip", "the state read back differs from the state set"
    )


def test_manual_seed_is_deterministic(accel_backend: Accelerator) -> None:
    accel_backend.manual_seed(7)
    first = accel_backend.get_rng_state()
    accel_backend.manual_seed(8)
    accel_backend.manual_seed(7)
    assert torch.equal(accel_backend.get_rng_state(), first), rule(
        "rng-seed", "manual_seed(7) twice gave different generator states"
    )


def _states(backend: Accelerator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.get_rng_state(), backend.get_rng_state()


def _assert_restored(backend: Accelerator, before: tuple[torch.Tensor, torch.Tensor]) -> None:
    cpu, device = _states(backend)
    assert torch.equal(cpu, before[0]), rule("fork-rng", "the CPU generator was not restored")
    assert torch.equal(device, before[1]), rule("fork-rng", "the device generator was not restored")


def test_fork_rng_restores(accel_backend: Accelerator) -> None:
    before = _states(accel_backend)
    with accel_backend.fork_rng():
        torch.manual_seed(99)
        accel_backend.manual_seed(99)
    _assert_restored(accel_backend, before)


def test_fork_rng_restores_on_exception(accel_backend: Accelerator) -> None:
    before = _states(accel_backend)
    with pytest.raises(_Boom), accel_backend.fork_rng():
        torch.manual_seed(5)
        accel_backend.manual_seed(5)
        raise _Boom
    _assert_restored(accel_backend, before)


def test_fork_rng_disabled(accel_backend: Accelerator) -> None:
    accel_backend.manual_seed(3)
    before = accel_backend.get_rng_state()
    with accel_backend.fork_rng(enabled=False):
        accel_backend.manual_seed(4)
    assert not torch.equal(accel_backend.get_rng_state(), before), rule(
        "fork-rng", "fork_rng(enabled=False) restored the generator; it must do nothing"
    )


@pytest.mark.accel_requires("tensors")
def test_same_seed_same_dropout(accel_backend: Accelerator) -> None:
    ones = torch.ones(4096, device=accel_backend.device())
    accel_backend.manual_seed(11)
    first = torch.nn.functional.dropout(ones, p=0.5).cpu()
    accel_backend.manual_seed(11)
    second = torch.nn.functional.dropout(ones, p=0.5).cpu()
    assert torch.equal(first, second), rule("dropout-seed", "masks differ for the same seed")
    accel_backend.manual_seed(12)
    third = torch.nn.functional.dropout(ones, p=0.5).cpu()
    assert not torch.equal(first, third), rule(
        "dropout-seed", "different seeds gave the same mask: dropout ignores the device generator"
    )
