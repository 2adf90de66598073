"""A vendor's accel plugin for fakenpu, named like the device: it replaces the generic one."""

from accel import Availability, BackendSpec, hookimpl
from backends.cpu import CpuBackend


class VendorBackend(CpuBackend):
    name = "fakenpu"


@hookimpl
def accel_backends():
    return [
        BackendSpec(
            name="fakenpu",
            factory=VendorBackend,
            probe=lambda: Availability(available=True, device_count=1),
            description="The vendor's own fakenpu backend.",
            priority=10,
        )
    ]
