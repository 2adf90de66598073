"""Finding TPU and Neuron devices from device nodes and sysfs, without importing torch_xla.

What marks each device, as the vendors' own runtimes find them:

* Google TPU: a PCI function of vendor ``0x1ae0`` (Google) whose device id is a TPU
  chip's (``/sys/bus/pci/devices/*/vendor`` and ``device``). These are the ids JAX
  (``jax/_src/hardware_utils.py``) and torch_xla (``torch_xla/_internal/tpu.py``) test
  for: 0x0027 (v2, v3), 0x0056, 0x005e (v4), 0x0062 (v5p), 0x0063 (v5e), 0x006f (v6e),
  0x0076 (TPU7x). The chip's node is ``/dev/accel*`` (v2 to v4) or ``/dev/vfio/*``
  (v5e and later), neither of which is TPU-specific, hence the PCI ids.
* AWS Trainium and Inferentia: the Neuron driver (aws-neuronx-dkms) creates one
  ``/dev/neuronN`` node per device; nothing else creates that name.

Every path is read below ``root``, so tests build fake trees in a temporary directory.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ACCELERATOR_CLIENTS",
    "FILESYSTEM_ROOT",
    "GOOGLE_PCI_VENDOR",
    "TPU_PCI_DEVICES",
    "HostScan",
    "scan",
]

# Where the probe looks for /dev and /sys; tests point it at a fake tree.
FILESYSTEM_ROOT = "/"
GOOGLE_PCI_VENDOR = "0x1ae0"
TPU_PCI_DEVICES = frozenset({"0x0027", "0x0056", "0x005e", "0x0062", "0x0063", "0x006f", "0x0076"})
# PJRT_DEVICE values naming a client of a device auto-detection may pick.
ACCELERATOR_CLIENTS = frozenset({"TPU", "NEURON"})
_NEURON_NODE = re.compile(r"neuron[0-9]+")


@dataclass(frozen=True)
class HostScan:
    """What :func:`scan` found.

    Attributes:
        tpu_chips: PCI addresses of TPU chips (``/sys/bus/pci/devices/<address>``).
        neuron_nodes: Neuron device nodes (``/dev/neuron0``...).
    """

    tpu_chips: tuple[str, ...]
    neuron_nodes: tuple[str, ...]

    @property
    def devices(self) -> tuple[str, ...]:
        """Every TPU chip and Neuron device found."""
        return (*self.tpu_chips, *self.neuron_nodes)

    def describe(self) -> str:
        """Say what was looked for, for an unavailability reason."""
        return (
            f"no PCI device of vendor {GOOGLE_PCI_VENDOR} with a TPU device id under "
            "/sys/bus/pci/devices, no /dev/neuron* node"
        )


def scan(root: str | os.PathLike[str] = "/") -> HostScan:
    """Return the TPU chips and Neuron device nodes below ``root``."""
    base = Path(root)
    return HostScan(_tpu_chips(base / "sys/bus/pci/devices"), _neuron_nodes(base / "dev"))


def _tpu_chips(devices: Path) -> tuple[str, ...]:
    try:
        addresses = sorted(os.listdir(devices))
    except OSError:
        return ()
    return tuple(
        address
        for address in addresses
        if _read(devices / address / "vendor") == GOOGLE_PCI_VENDOR
        and _read(devices / address / "device") in TPU_PCI_DEVICES
    )


def _neuron_nodes(dev: Path) -> tuple[str, ...]:
    try:
        names = sorted(os.listdir(dev))
    except OSError:
        return ()
    return tuple(f"/dev/{name}" for name in names if _NEURON_NODE.fullmatch(name))


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii").strip().lower()
    except (OSError, UnicodeDecodeError):
        return ""
