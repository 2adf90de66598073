"""An accelerator that outranks every built-in, looks available, and fails to start.

Like a vendor bridge built for another torch: the cheap probe says yes, the runtime
refuses when the backend is created.
"""

from accel import Availability, BackendSpec, hookimpl


def _refuse():
    raise RuntimeError("fake runtime refused to start")


@hookimpl
def accel_backends():
    return [
        BackendSpec(
            name="fakefailing",
            factory=_refuse,
            probe=lambda: Availability(available=True, device_count=1),
            description="Fake accelerator whose factory raises.",
            priority=500,
        )
    ]
