"""Fixtures for the framework adapters: the shared helpers module, clean process state."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

SCRIPTS = Path(__file__).resolve().parent / "scripts"


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
