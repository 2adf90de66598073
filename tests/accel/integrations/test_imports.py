"""``import accel`` (and the integrations package) imports neither framework."""

from __future__ import annotations

import subprocess
import sys

FRAMEWORKS = ("lightning", "pytorch_lightning", "deepspeed")


def test_importing_accel_imports_no_framework() -> None:
    code = (
        "import sys, accel, accel.integrations, accel.distributed\n"
        "accel.get_backend()\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {FRAMEWORKS!r}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == "[]", result.stdout + result.stderr
