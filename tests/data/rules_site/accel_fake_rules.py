"""Two backends that each break one conformance rule (device-count, rng-copy)."""

import torch
from backends._common import checked_index
from backends.cpu import CpuBackend

from accel import Availability, BackendSpec, hookimpl


class CardCountBackend(CpuBackend):
    """Counts every card on the node but lets the process use index 0 only."""

    name = "fakecardcount"

    def device_count(self):
        return 8

    def device(self, index=None):
        if index is not None:
            checked_index(self.name, index, 1)
        return self.the_device


class LiveStateBackend(CpuBackend):
    """Returns its live generator state, as the Gaudi bridge does in philox mode."""

    name = "fakelivestate"

    def __init__(self):
        self._live = torch.get_rng_state()

    def get_rng_state(self):
        self._live.copy_(torch.get_rng_state())
        return self._live

    def set_rng_state(self, state):
        self._live.copy_(state)
        torch.set_rng_state(self._live.clone())


def _probe(count):
    return lambda: Availability(available=True, device_count=count)


@hookimpl
def accel_backends():
    return [
        BackendSpec(name="fakecardcount", factory=CardCountBackend, probe=_probe(8)),
        BackendSpec(name="fakelivestate", factory=LiveStateBackend, probe=_probe(1)),
    ]
