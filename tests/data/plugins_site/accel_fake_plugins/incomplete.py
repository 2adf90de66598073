"""A plugin whose backend object lacks most Accelerator members."""

from accel import Availability, BackendSpec, hookimpl


class Incomplete:
    name = "fakeincomplete"
    device_type = "cpu"

    def mark_step(self):
        pass


@hookimpl
def accel_backends():
    return [
        BackendSpec(
            name="fakeincomplete",
            factory=Incomplete,
            probe=lambda: Availability(available=True, device_count=1),
        )
    ]
