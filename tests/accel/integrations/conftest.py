"""Fixtures for the framework adapters: the shared helpers module, clean process state."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

import accel

SCRIPTS = Path(__file__).resolve().parent / "scripts"
NO_TORCH_XLA = "torch_xla is not installed (CI's xla cell installs torch_xla 2.9 on torch 2.9.1)"


def _load_common() -> ModuleType:
    """Import scripts/common.py as ``accel_integration_common`` (the scripts import it too)."""
    loaded = sys.modules.get("accel_integration_common")
    if loaded is not None:
        return loaded
    spec = importlib.util.spec_from_file_location("accel_integration_common", SCRIPTS / "common.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["accel_integration_common"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def common() -> ModuleType:
    return _load_common()


@pytest.fixture(autouse=True)
def _restore_torch_state() -> Iterator[None]:
    """The frameworks seed torch and set thread counts; give every test the state it found."""
    rng = torch.get_rng_state()
    threads = torch.get_num_threads()
    yield
    torch.set_rng_state(rng)
    torch.set_num_threads(threads)


@pytest.fixture
def xla() -> accel.Accelerator:
    """accel's ``xla`` backend (torch_xla's client, CPU in CI's xla cell), or a skip."""
    if importlib.util.find_spec("torch_xla") is None:
        pytest.skip(NO_TORCH_XLA)
    try:
        return accel.get_backend("xla")
    except accel.BackendNotFoundError:
        pytest.skip("accel has no xla backend in this build (backends/xla.py)")
    except accel.BackendUnavailableError as exc:
        pytest.skip(f"accel's xla backend cannot run here: {exc}")


@pytest.fixture
def torch_xla_installed() -> None:
    """Skip unless torch_xla is installed."""
    if importlib.util.find_spec("torch_xla") is None:
        pytest.skip(NO_TORCH_XLA)
