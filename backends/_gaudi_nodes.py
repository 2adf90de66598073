"""Finding Gaudi cards from device nodes and sysfs, without importing Habana's bridge.

The habanalabs driver creates ``/dev/accel/accelN`` (the kernel's generic accelerator
class) and, in older releases, ``/dev/hlN``; each has a control node beside it
(``accel_controlDN``, ``hl_controlDN``) that is not a device. The accel class is shared
with other drivers (Intel NPUs, AMD XDNA, Rockchip NPUs), so a node counts only when
sysfs says its driver is ``habanalabs``, or, where the driver link cannot be read, when
its PCI vendor is Habana Labs (0x1da3).

Every path is read below ``root``, so tests build fake trees in a temporary directory.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DRIVER", "PCI_VENDOR", "NODE_KINDS", "NodeScan", "scan"]

DRIVER = "habanalabs"
PCI_VENDOR = "0x1da3"


@dataclass(frozen=True)
class _NodeKind:
    dev_dir: str
    pattern: re.Pattern[str]
    sys_class: str


# (device directory, node name, sysfs class directory), relative to the root.
NODE_KINDS = (
    _NodeKind("dev/accel", re.compile(r"accel[0-9]+"), "sys/class/accel"),
    _NodeKind("dev", re.compile(r"hl[0-9]+"), "sys/class/habanalabs"),
)


@dataclass(frozen=True)
class NodeScan:
    """What :func:`scan` found.

    Attributes:
        gaudi: Device nodes driven by habanalabs (``/dev/accel/accel0``...).
        others: Device nodes of the same classes that belong to another driver, or whose
            driver could not be read, as ``"<node> (<driver or why unknown>)"``.
    """

    gaudi: tuple[str, ...]
    others: tuple[str, ...]


def scan(root: str | os.PathLike[str] = "/") -> NodeScan:
    """Return the Gaudi device nodes below ``root`` and the other accelerator nodes seen."""
    base = Path(root)
    gaudi: list[str] = []
    others: list[str] = []
    for kind in NODE_KINDS:
        try:
            names = sorted(os.listdir(base / kind.dev_dir))
        except OSError:
            continue
        for name in names:
            if not kind.pattern.fullmatch(name):
                continue  # control nodes and unrelated files
            node = f"/{kind.dev_dir}/{name}"
            owner = _owner(base / kind.sys_class / name / "device")
            if owner == DRIVER:
                gaudi.append(node)
            else:
                others.append(f"{node} ({owner})")
    return NodeScan(tuple(gaudi), tuple(others))


def _owner(device: Path) -> str:
    """Return ``DRIVER`` for a Gaudi, else the node's driver or why it is unknown."""
    try:
        driver = os.path.basename(os.readlink(device / "driver"))
    except OSError:
        driver = ""
    if driver:
        return driver
    try:
        vendor = (device / "vendor").read_text(encoding="ascii").strip().lower()
    except (OSError, UnicodeDecodeError):
        return "driver unknown: sysfs has no driver link or PCI vendor for it"
    return DRIVER if vendor == PCI_VENDOR else f"PCI vendor {vendor}"
