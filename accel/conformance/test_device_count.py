"""One meaning of ``device_count()``: the devices this process can use, ``device(i)`` for each."""

from __future__ import annotations

import torch

import accel
from accel import Accelerator, DeviceIndexError
from accel.conformance import rule


def test_every_index_below_device_count_is_usable(accel_backend: Accelerator) -> None:
    count = accel_backend.device_count()
    devices: list[torch.device] = []
    for index in range(count):
        try:
            devices.append(accel_backend.device(index))
        except DeviceIndexError as exc:
            raise AssertionError(
                rule(
                    "device-count",
                    f"device({index}) raised DeviceIndexError ({exc}) although device_count() "
                    f"is {count}; count only the devices this process can use",
                )
            ) from exc
    assert all(device.type == accel_backend.device_type for device in devices), rule(
        "device-count", f"device(i) gave {devices}, not {accel_backend.device_type!r} devices"
    )
    assert len(set(devices)) == count, rule(
        "device-count", f"the {count} indices gave {len(set(devices))} distinct devices"
    )


def test_the_index_device_count_is_not_usable(accel_backend: Accelerator) -> None:
    count = accel_backend.device_count()
    try:
        device = accel_backend.device(count)
    except DeviceIndexError:
        return
    raise AssertionError(
        rule(
            "device-count",
            f"device({count}) returned {device} although device_count() is {count}; "
            "device_count() must count every usable index",
        )
    )


def test_listing_reports_the_same_count(accel_backend: Accelerator) -> None:
    rows = [row for row in accel.list_backends() if row.name == accel_backend.name]
    counts = {row.device_count for row in rows}
    assert counts == {accel_backend.device_count()}, rule(
        "device-count",
        f"python -m accel lists {sorted(counts)} device(s) (the probe's count) but "
        f"device_count() is {accel_backend.device_count()}",
    )
