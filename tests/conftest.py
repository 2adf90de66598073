"""Fixtures shared by the whole test suite."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import accel

pytest_plugins = ["pytester"]

_DOUBLES_DIR = Path(__file__).resolve().parent / "doubles"


def _load_by_path(name: str, path: Path) -> ModuleType:
    """Import a helper module from its file, without putting its folder on sys.path.

    Leaving tests/doubles on sys.path would make the habana_frameworks double
    importable in every test; tests reach these helpers as ``sys.modules[name]``. When a
    module was already loaded (``-p habana_double``), that module is reused.
    """
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


habana_double_helpers = _load_by_path("habana_double", _DOUBLES_DIR / "habana_double.py")
# The documentation's code blocks, for tests/test_docs.py and the torchrun examples' test.
_load_by_path("docs_blocks", Path(__file__).resolve().parent / "docs_blocks.py")
# Two ranks of a gloo group as subprocesses, for the distributed tests.
_load_by_path("accel_two_ranks", Path(__file__).resolve().parent / "two_ranks.py")
# The planner tests' simulated host (a clock that only operators advance).
_load_by_path(
    "_simulated_host", Path(__file__).resolve().parent / "checkpointing" / "_simulated_host.py"
)
# Rates with the saved-tensor grain's machinery free, for the grain's tests.
_load_by_path("_grain_rates", Path(__file__).resolve().parent / "checkpointing" / "_grain_rates.py")
# A planned model's training steps held against the plain model's, bit for bit.
_load_by_path("_same_steps", Path(__file__).resolve().parent / "checkpointing" / "_same_steps.py")
# The benchmarks' model zoo, for the planner tests. The sdist ships no benchmarks/, and
# its smoke tests do not use the zoo.
_ZOO = Path(__file__).resolve().parents[1] / "benchmarks" / "_zoo.py"
if _ZOO.exists():
    _load_by_path("accel_zoo", _ZOO)

_ENV_VARIABLES = (
    "ACCEL",
    "ACCEL_STRICT_PLUGINS",
    "ACCEL_DISABLE_PLUGIN_AUTOLOAD",
    "ACCEL_DISABLED_PLUGINS",
    "PT_HPU_LAZY_MODE",
)


@pytest.fixture(autouse=True)
def _clean_accel_state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Run every test without ACCEL* variables, with no cached backends, and with an
    empty rates cache of its own (calibrated rates never leak between tests, nor come
    from the machine's own cache)."""
    for variable in _ENV_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path / "accel-cache"))
    accel.reset_backends()
    yield
    accel.reset_backends()


@pytest.fixture
def habana_double(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[ModuleType]:
    """Activate the habana_frameworks double; yield its recorder (``habana_frameworks._double``).

    One fake Gaudi device node exists, so ``get_backend("hpu")`` works. Everything is
    undone after the test.
    """
    activation = habana_double_helpers.activate(monkeypatch, tmp_path / "dev")
    try:
        yield activation.recorder
    finally:
        habana_double_helpers.deactivate(activation)


NO_PRIVATEUSE1_DEVICE = (
    "no device has joined torch through PrivateUse1 here (CI's openreg cell builds PyTorch's "
    "reference device: bash ../shared/openreg/build.sh PYTHON)"
)


@pytest.fixture
def privateuse1_device() -> str:
    """The device type a vendor registered through PrivateUse1; skips where there is none."""
    from backends.privateuse1 import registered_device

    name = registered_device()
    if name is None:
        pytest.skip(NO_PRIVATEUSE1_DEVICE)
    return name
