"""Switch the ``habana_frameworks`` test double on and off, and a pytest plugin doing so.

Helpers::

    activation = activate(monkeypatch, tmp_path)  # monkeypatch may be None
    recorder = activation.recorder                # habana_frameworks._double
    ...
    deactivate(activation)

:func:`activate` puts ``tests/doubles`` first on ``sys.path``, builds a fake filesystem
tree with Gaudi device nodes in ``node_dir`` (:func:`make_device_tree`) and points
``backends.hpu.FILESYSTEM_ROOT`` at it, resets the double and calls
:func:`accel.reset_backends`. :func:`deactivate` undoes what the bridge changed in the
process (torch patches, environment variables), drops every ``habana_frameworks`` module
from ``sys.modules``, restores ``sys.path`` and ``FILESYSTEM_ROOT`` and calls
:func:`accel.reset_backends` again.

As a pytest plugin (``PYTHONPATH=tests/doubles python -m pytest -p habana_double``) it
activates the double for the whole session, so ``hpu`` is an available backend.
"""

from __future__ import annotations

import importlib
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import accel
import backends.hpu

__all__ = [
    "AUTOLOAD_SITE",
    "DOUBLES_DIR",
    "VENDOR_PACKAGE",
    "Activation",
    "activate",
    "deactivate",
    "make_device_tree",
    "purge_vendor_modules",
]

DOUBLES_DIR = Path(__file__).resolve().parent
# Distribution metadata registering the double's torch.backends autoload entry point.
AUTOLOAD_SITE = DOUBLES_DIR / "autoload_site"
VENDOR_PACKAGE = "habana_frameworks"


@dataclass
class Activation:
    """What :func:`activate` changed, for :func:`deactivate` to restore."""

    recorder: ModuleType
    node_dir: Path
    saved_root: str
    monkeypatch: Any = None


def purge_vendor_modules() -> None:
    """Remove ``habana_frameworks`` and all its submodules from ``sys.modules``."""
    for name in list(sys.modules):
        if name == VENDOR_PACKAGE or name.startswith(VENDOR_PACKAGE + "."):
            del sys.modules[name]


def _driver_link(device: Path, driver: str) -> None:
    device.mkdir(parents=True, exist_ok=True)
    (device / "driver").symlink_to(f"../../../../bus/pci/drivers/{driver}")


def make_device_tree(
    root: Path,
    *,
    gaudi: int = 1,
    npu: int = 0,
    old_gaudi: int = 0,
    vendor_only: int = 0,
    control_nodes: bool = True,
) -> Path:
    """Build a fake ``/dev`` and ``/sys`` below ``root``, as the kernel lays them out.

    Args:
        root: The directory standing for ``/``.
        gaudi: ``/dev/accel/accelN`` nodes whose sysfs driver link is ``habanalabs``.
        npu: Further accel nodes of another driver (``intel_vpu``, an Intel NPU).
        old_gaudi: ``/dev/hlN`` nodes of older habanalabs drivers (sysfs class
            ``habanalabs``).
        vendor_only: Further accel nodes with no driver link, only the PCI vendor file
            (Habana Labs, ``0x1da3``).
        control_nodes: Also create the control node beside each device node
            (``accel_controlDN``, ``hl_controlDN``), which are not devices.

    Returns:
        ``root``.
    """
    accel_dev = root / "dev" / "accel"
    accel_dev.mkdir(parents=True, exist_ok=True)
    index = 0
    for driver, count in (("habanalabs", gaudi), ("intel_vpu", npu), ("", vendor_only)):
        for _ in range(count):
            (accel_dev / f"accel{index}").touch()
            if control_nodes:
                (accel_dev / f"accel_controlD{64 + index}").touch()
            device = root / "sys" / "class" / "accel" / f"accel{index}" / "device"
            if driver:
                _driver_link(device, driver)
            else:
                device.mkdir(parents=True, exist_ok=True)
                (device / "vendor").write_text("0x1da3\n", encoding="ascii")
            index += 1
    for number in range(old_gaudi):
        (root / "dev" / f"hl{number}").touch()
        if control_nodes:
            (root / "dev" / f"hl_controlD{number}").touch()
        _driver_link(root / "sys" / "class" / "habanalabs" / f"hl{number}" / "device", "habanalabs")
    return root


def activate(monkeypatch: Any, node_dir: Path, *, device_count: int = 1) -> Activation:
    """Make the double importable and present ``device_count`` fake Gaudi devices.

    Args:
        monkeypatch: A ``pytest.MonkeyPatch`` (its undo then also restores what this
            changed), or ``None``.
        node_dir: An empty directory for the fake filesystem tree.
        device_count: How many Gaudi device nodes to create; also the double's
            ``DEVICE_COUNT`` knob (the cards the bridge counts on the node).

    Returns:
        The :class:`Activation` to pass to :func:`deactivate`; its ``recorder`` is
        ``habana_frameworks._double``, freshly reset.
    """
    saved_root = backends.hpu.FILESYSTEM_ROOT
    root = str(make_device_tree(node_dir, gaudi=device_count))
    purge_vendor_modules()
    if monkeypatch is not None:
        monkeypatch.syspath_prepend(str(DOUBLES_DIR))
        monkeypatch.setattr(backends.hpu, "FILESYSTEM_ROOT", root)
    else:
        sys.path.insert(0, str(DOUBLES_DIR))
        backends.hpu.FILESYSTEM_ROOT = root
    importlib.invalidate_caches()
    recorder = importlib.import_module(f"{VENDOR_PACKAGE}._double")
    recorder.reset()
    recorder.DEVICE_COUNT = device_count
    accel.reset_backends()
    return Activation(recorder, node_dir, saved_root, monkeypatch)


def deactivate(activation: Activation) -> None:
    """Undo :func:`activate` and what the bridge did: patches, environment, modules, path."""
    activation.recorder.undo_process_changes()
    purge_vendor_modules()
    # Remove the entry activate() put first; a PYTHONPATH entry further on stays.
    if str(DOUBLES_DIR) in sys.path:
        sys.path.remove(str(DOUBLES_DIR))
    backends.hpu.FILESYSTEM_ROOT = activation.saved_root
    importlib.invalidate_caches()
    accel.reset_backends()


# pytest plugin --------------------------------------------------------------------------

_session: dict[str, Any] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Activate the double for the whole session (fake nodes in a temporary directory).

    It runs before other plugins' ``pytest_configure``, so one that lists backends at
    configuration (``accel.testing``) already sees ``hpu``.
    """
    node_dir = Path(tempfile.mkdtemp(prefix="habana-double-"))
    _session["activation"] = activate(None, node_dir)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Deactivate the session's double and delete its device nodes."""
    activation = _session.pop("activation", None)
    if activation is not None:
        deactivate(activation)
        shutil.rmtree(activation.node_dir, ignore_errors=True)
