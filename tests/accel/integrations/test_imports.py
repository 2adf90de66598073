"""``import accel`` imports neither framework; each adapter's public API is complete."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
from types import ModuleType

import pytest

FRAMEWORKS = ("lightning", "pytorch_lightning", "deepspeed")


def test_importing_accel_imports_no_framework() -> None:
    code = (
        "import sys, accel, accel.integrations, accel.distributed\n"
        "accel.get_backend()\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {FRAMEWORKS!r}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=True
    )
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


def _check_public_api(package: ModuleType) -> None:
    """``__all__`` is sorted, documented, and lists every public name the package defines."""
    assert package.__all__ == sorted(package.__all__)
    assert all(inspect.getdoc(getattr(package, name)) for name in package.__all__)
    defined = {
        name
        for module_name, module in sys.modules.items()
        if module_name.startswith(package.__name__ + ".")
        for name in getattr(module, "__all__", ())
    }
    assert defined <= set(package.__all__) | {"ProtocolAnswers"}  # the mixin stays internal


def test_the_lightning_adapters_public_api() -> None:
    pytest.importorskip("lightning", reason="Lightning is not installed")
    _check_public_api(importlib.import_module("accel.integrations.lightning"))


def test_the_deepspeed_adapters_public_api() -> None:
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed")
    _check_public_api(importlib.import_module("accel.integrations.deepspeed"))
