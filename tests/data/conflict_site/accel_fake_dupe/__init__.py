"""Provides a backend named fakeok, like accel-fake-plugins does."""

from accel_fake_plugins.working import FakeOkBackend

from accel import Availability, BackendSpec, hookimpl


@hookimpl
def accel_backends():
    return [
        BackendSpec(
            name="fakeok",
            factory=FakeOkBackend,
            probe=lambda: Availability(available=True, device_count=1),
            description="The second provider's fakeok.",
            priority=-2,
        )
    ]
