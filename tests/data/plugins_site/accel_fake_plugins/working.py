"""A working plugin: a CPU backend under another name."""

from backends.cpu import CpuBackend

from accel import Availability, BackendSpec, hookimpl


class FakeOkBackend(CpuBackend):
    name = "fakeok"


@hookimpl
def accel_backends():
    return [
        BackendSpec(
            name="fakeok",
            factory=FakeOkBackend,
            probe=lambda: Availability(available=True, device_count=1),
            description="Fake working backend.",
            priority=-1,
        )
    ]
