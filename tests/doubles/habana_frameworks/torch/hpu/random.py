"""Double of ``habana_frameworks.torch.hpu.random``.

The generator is a private CPU ``torch.Generator``, so states are real ``uint8`` tensors
that round-trip. As in the real bridge, any device index other than 0 is refused.
"""

from __future__ import annotations

from typing import Any

import torch

from habana_frameworks import _double

__all__ = ["get_rng_state", "manual_seed", "set_rng_state"]

_generator = torch.Generator()
_initial_state = _generator.get_state()


def _reset_generator() -> None:
    _generator.set_state(_initial_state)


_double.on_reset(_reset_generator)


def _device_index(device: Any) -> int:
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    parsed = torch.device(device)
    if parsed.type != "hpu":
        raise RuntimeError(f"expected an hpu device, got {device!r}")
    return 0 if parsed.index is None else parsed.index


def _check_device(function: str, device: Any) -> None:
    if _device_index(device) != 0:
        raise RuntimeError(f"hpu {function} supports only device 0")


def get_rng_state(device: Any = "hpu") -> torch.Tensor:
    """Return a copy of the generator state of ``device`` (device 0 only)."""
    _double.record("hpu.random.get_rng_state", device)
    _check_device("get_rng_state", device)
    return _generator.get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = "hpu") -> None:
    """Restore a state returned by :func:`get_rng_state` (device 0 only)."""
    _double.record("hpu.random.set_rng_state", new_state, device)
    _check_device("set_rng_state", device)
    _generator.set_state(new_state)


def manual_seed(seed: int) -> None:
    """Seed the generator."""
    _double.record("hpu.random.manual_seed", seed)
    _generator.manual_seed(seed)
