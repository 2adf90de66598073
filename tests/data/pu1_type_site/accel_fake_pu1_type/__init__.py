"""A vendor's accel plugin named fakevendor that declares device_type fakenpu."""

from accel import Availability, BackendSpec, hookimpl
from backends.cpu import CpuBackend


class VendorBackend(CpuBackend):
    name = "fakevendor"


@hookimpl
def accel_backends():
    return [
        BackendSpec(
            name="fakevendor",
            factory=VendorBackend,
            probe=lambda: Availability(available=True, device_count=1),
            description="The vendor's fakenpu backend under another name.",
            priority=10,
            device_type="fakenpu",
        )
    ]
