"""accel._compat: the one place that knows how torch releases differ."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from accel import _compat

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("accel", "backends", "checkpointing", "offload")


@pytest.mark.parametrize(
    ("version", "release"),
    [
        ("2.4.1+cu121", (2, 4)),
        ("2.13.0+cpu", (2, 13)),
        ("2.15.0", (2, 15)),
        ("2.16.0a0+git", (2, 16)),
    ],
)
def test_torch_release(
    monkeypatch: pytest.MonkeyPatch, version: str, release: tuple[int, int]
) -> None:
    monkeypatch.setattr(torch, "__version__", version)
    assert _compat.torch_release() == release


def _compares_versions(node: ast.AST) -> bool:
    """A comparison that reads torch's version or calls torch_release()."""
    if not isinstance(node, ast.Compare):
        return False
    for part in ast.walk(node):
        if isinstance(part, ast.Attribute) and part.attr == "__version__":
            return True
        if isinstance(part, ast.Call) and getattr(part.func, "id", None) == "torch_release":
            return True
    return False


def test_version_comparisons_live_in_compat_or_its_callers_only() -> None:
    # Every comparison against torch's version goes through _compat's named constants.
    offenders = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name == "_compat.py":
                continue
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if (
                    _compares_versions(node)
                    and "_compat" not in ast.unparse(node)
                    and ("MIN_RELEASE" not in ast.unparse(node))
                ):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == [], (
        "torch version checks outside accel/_compat.py (put the difference there, naming the "
        f"release): {offenders}"
    )


def test_post_accumulate_hooks_without_a_gradient_are_probed_once() -> None:
    answer = _compat.post_accumulate_hooks_run_without_gradient()
    assert isinstance(answer, bool)
    assert _compat.post_accumulate_hooks_run_without_gradient() is answer  # cached
    if _compat.torch_release() >= (2, 9):  # 2.9.1 and 2.13.0 were checked by hand
        assert answer
