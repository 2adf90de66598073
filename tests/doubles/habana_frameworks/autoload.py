"""Double of ``habana_frameworks.autoload``: the bridge's ``torch.backends`` entry point.

torch (2.5 and later) calls every ``torch.backends`` entry point at ``import torch``
unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``. Releases whose lazy-mode default is off
import the bridge from here unless ``PT_HPU_AUTOLOAD=0`` or ``PT_HPU_LAZY_MODE=1``.
"""

from __future__ import annotations

import importlib
import os

__all__ = ["__autoload"]


def __autoload() -> None:
    """Import ``habana_frameworks.torch`` unless autoload is switched off."""
    if os.environ.get("PT_HPU_AUTOLOAD", "1") == "0":
        return
    if os.environ.get("PT_HPU_LAZY_MODE", "0") == "1":
        return
    importlib.import_module("habana_frameworks.torch")
