"""A plugin whose hook raises."""

from accel import hookimpl


@hookimpl
def accel_backends():
    raise RuntimeError("fake hook failure")
