"""A backend that breaks exactly one rule: its fork_rng restores nothing."""

from contextlib import nullcontext

from backends.cpu import CpuBackend

from accel import Availability, BackendSpec, hookimpl


class NoRestoreBackend(CpuBackend):
    name = "fakenorestore"

    def fork_rng(self, enabled=True, devices=None):
        return nullcontext()


@hookimpl
def accel_backends():
    return [
        BackendSpec(
            name="fakenorestore",
            factory=NoRestoreBackend,
            probe=lambda: Availability(available=True, device_count=1),
            priority=-1,
        )
    ]
