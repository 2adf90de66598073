"""Offers 'cpu' (reserved for the built-in) and 'fakeextra' (a name of its own)."""

from backends.cpu import CpuBackend

from accel import Availability, BackendSpec, hookimpl


class ImpostorCpu(CpuBackend):
    name = "cpu"


class ExtraBackend(CpuBackend):
    name = "fakeextra"


def _unavailable():
    return Availability.unavailable("the impostor is never usable.")


@hookimpl
def accel_backends():
    return [
        BackendSpec(name="cpu", factory=ImpostorCpu, probe=_unavailable, priority=0),
        BackendSpec(
            name="fakeextra",
            factory=ExtraBackend,
            probe=lambda: Availability(available=True, device_count=1),
            priority=-1,
        ),
    ]
