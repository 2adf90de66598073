"""Identity, device indices, capability flags and the no-initialisation rule."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import accel
from accel import Accelerator, DeviceIndexError
from accel._protocol import iter_missing_members
from accel.conformance import rule

CAPABILITY_FLAGS = (
    "is_lazy",
    "is_asynchronous",
    "supports_streams",
    "supports_pinned_memory",
    "supports_memory_stats",
)


def test_members(accel_backend: Accelerator) -> None:
    missing = list(iter_missing_members(accel_backend))
    assert not missing, rule("members", f"missing {missing}")
    assert isinstance(accel_backend, Accelerator), rule("members", "isinstance check failed")


def test_identity(accel_backend: Accelerator) -> None:
    device = accel_backend.device()
    assert isinstance(device, torch.device), rule("identity", f"device() returned {device!r}")
    assert device.type == accel_backend.device_type, rule(
        "identity", f"device().type {device.type!r} != device_type {accel_backend.device_type!r}"
    )
    assert torch.device(str(device)) == device, rule("identity", f"{device!r} does not round-trip")
    assert accel_backend.name == accel_backend.name.strip().lower(), rule(
        "identity", f"name {accel_backend.name!r} is not lowercase"
    )
    assert accel.get_backend(accel_backend.name) is accel_backend, rule(
        "identity", "get_backend(name) did not return the same instance"
    )


def test_device_count_and_current(accel_backend: Accelerator) -> None:
    count = accel_backend.device_count()
    assert isinstance(count, int) and count >= 1, rule(
        "identity", f"an available backend reported device_count() == {count!r}"
    )
    current = accel_backend.current_device()
    assert 0 <= current < count, rule("identity", f"current_device() {current} not in range")
    accel_backend.set_device(current)
    assert accel_backend.device(current) == accel_backend.device(), rule(
        "identity", "device(current_device()) differs from device()"
    )


@pytest.mark.parametrize("index", [-1, 10_000])
def test_invalid_index(accel_backend: Accelerator, index: int) -> None:
    with pytest.raises(DeviceIndexError):
        accel_backend.device(index)
    with pytest.raises(DeviceIndexError):
        accel_backend.set_device(index)


def test_capability_flags_are_bools(accel_backend: Accelerator) -> None:
    for flag in CAPABILITY_FLAGS:
        value = getattr(accel_backend, flag)
        assert isinstance(value, bool), rule("capabilities", f"{flag} is {value!r}")
    assert accel_backend.is_available() is True, rule(
        "capabilities", "is_available() is not True on a backend selected as available"
    )


# Run in a fresh interpreter: in the suite's own process earlier tests have initialised
# the device, so an in-process check could only skip. Prints a JSON line on stdout.
_NO_INIT_SCRIPT = """
import json, sys
import torch
name, device_type = sys.argv[1], sys.argv[2]
def state():
    check = getattr(getattr(torch, device_type, None), "is_initialized", None)
    return bool(check()) if callable(check) else None
if state():
    # No lazy initialisation to check (torch.cpu reports itself initialised at import).
    print(json.dumps({"checkable": False}))
    raise SystemExit(0)
import accel
try:
    backend = accel.get_backend(name)
except Exception as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
    raise SystemExit(0)
after_select = state()  # a vendor's module may appear only now (torch.hpu)
if after_select is None:
    print(json.dumps({"checkable": False}))
    raise SystemExit(0)
backend.is_available()
backend.device_count()
backend.device()
print(json.dumps({"checkable": True, "after_select": after_select, "after_queries": state()}))
"""


def _fresh_process_check(name: str, device_type: str) -> dict[str, object]:
    environment = dict(os.environ)
    # The suite's import path (a plugin or double found through it) in the same order.
    environment["PYTHONPATH"] = os.pathsep.join(path for path in sys.path if path)
    done = subprocess.run(
        [sys.executable, "-c", _NO_INIT_SCRIPT, name, device_type],
        capture_output=True,
        text=True,
        env=environment,
        # Generous: a cold `import torch` (and a vendor's library) on a loaded CI machine.
        timeout=600,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        pytest.fail(
            rule(
                "no-init",
                f"the check in a fresh process exited {done.returncode}: {done.stderr[-2000:]}",
            )
        )
    result: dict[str, object] = json.loads(lines[-1])
    return result


def test_queries_do_not_initialise(accel_backend: Accelerator) -> None:
    module = getattr(torch, accel_backend.device_type, None)
    if not callable(getattr(module, "is_initialized", None)):
        pytest.skip(f"torch.{accel_backend.device_type} has no initialisation state to check.")
    result = _fresh_process_check(accel_backend.name, accel_backend.device_type)
    if not result.get("checkable", True):
        pytest.skip(
            f"in a fresh process torch.{accel_backend.device_type} has no initialisation "
            "state, or reports itself initialised before accel is imported (torch.cpu "
            "does): there is no lazy initialisation to check."
        )
    if "error" in result:
        # A backend registered only in this process (a test's own plugin object): check
        # here, where that is still meaningful.
        is_initialized = module.is_initialized  # type: ignore[union-attr]
        if is_initialized():
            pytest.skip(
                f"backend {accel_backend.name!r} cannot be created in a fresh process "
                f"({result['error']}) and torch.{accel_backend.device_type} is already "
                "initialised here; register it through an entry point to check this rule."
            )
        accel_backend.is_available()
        accel_backend.device_count()
        accel_backend.device()
        result = {"checkable": True, "after_select": False, "after_queries": is_initialized()}
    assert not result["after_select"], rule(
        "no-init", "import accel and get_backend() initialised the device"
    )
    assert not result["after_queries"], rule(
        "no-init", "is_available()/device_count()/device() initialised the device"
    )
