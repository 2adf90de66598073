"""Double of ``habana_frameworks.torch.hpu.random``.

The generator is a private CPU ``torch.Generator``, so states are real ``uint8`` tensors
that round-trip. As in the bridge: any device index other than 0 is refused; a device
string that is not an hpu device raises ``ValueError``; :func:`manual_seed` returns the
generator; after ``set_rng_ctx("philox")``, :func:`get_rng_state` returns one shared
16-byte state tensor (seed, offset), and :func:`set_rng_state` copies into it and
re-seeds the generator from it, so a state obtained earlier changes with it.
"""

from __future__ import annotations

from typing import Any

import torch

from habana_frameworks import _double

__all__ = [
    "get_rng_state",
    "initial_seed",
    "manual_seed",
    "set_rng_ctx",
    "set_rng_state",
    "unset_rng_ctx",
]

_generator = torch.Generator()
_initial_state = _generator.get_state()
_philox: dict[str, Any] = {"on": False, "state": None}


def _reset_generator() -> None:
    _generator.set_state(_initial_state)
    _philox.update(on=False, state=None)


_double.on_reset(_reset_generator)


def _device_index(device: Any) -> int:
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        parsed = None
    if parsed is None or parsed.type != "hpu":
        raise ValueError(f"Expected a hpu device, but got: {device!r}")
    return 0 if parsed.index is None else parsed.index


def _check_device(function: str, device: Any) -> None:
    if _device_index(device) != 0:
        raise RuntimeError(f"hpu {function} supports only device 0")


def get_rng_state(device: Any = "hpu") -> torch.Tensor:
    """Return the generator state of ``device`` (device 0 only); shared in philox mode."""
    _double.record("hpu.random.get_rng_state", device)
    _check_device("get_rng_state", device)
    if not _philox["on"]:
        return _generator.get_state()
    if _philox["state"] is None:
        seed = torch.tensor([_generator.initial_seed()], dtype=torch.int64).view(torch.uint8)
        _philox["state"] = torch.cat([seed, torch.zeros(8, dtype=torch.uint8)])
    state: torch.Tensor = _philox["state"]
    return state


def set_rng_state(new_state: torch.Tensor, device: Any = "hpu") -> None:
    """Restore a state returned by :func:`get_rng_state` (device 0 only)."""
    _double.record("hpu.random.set_rng_state", new_state, device)
    _check_device("set_rng_state", device)
    if not _philox["on"]:
        _generator.set_state(new_state)
        return
    shared = get_rng_state(device)
    shared.copy_(new_state)
    seed = int.from_bytes(bytes(shared[:8].tolist()), "little")
    offset = int.from_bytes(bytes(shared[8:16].tolist()), "little")
    _generator.manual_seed((seed * 1_000_003 + offset) % (2**63))


def manual_seed(seed: int) -> torch.Generator:
    """Seed the generator and return it, like the bridge."""
    _double.record("hpu.random.manual_seed", seed)
    return _generator.manual_seed(int(seed))


def initial_seed() -> int:
    """Return the seed the generator was last seeded with."""
    return int(_generator.initial_seed())


def set_rng_ctx(rng_ctx: str = "philox") -> None:
    """Switch to the philox RNG context (the only one the bridge knows)."""
    if rng_ctx != "philox":
        raise ValueError(f"Unsupported RNG context: {rng_ctx}. Supported context is 'philox'.")
    _double.record("hpu.random.set_rng_ctx", rng_ctx)
    _philox["on"] = True


def unset_rng_ctx(rng_ctx: str = "philox") -> None:
    """Return to the default (Mersenne Twister) RNG context."""
    if rng_ctx != "philox":
        raise ValueError(f"Unsupported RNG context: {rng_ctx}. Supported context is 'philox'.")
    _double.record("hpu.random.unset_rng_ctx", rng_ctx)
    _philox["on"] = False
