from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest

import accel
from accel import _select
from accel._discovery import Catalog


def test_explicit_beats_accel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEL", "recording")
    assert accel.select_backend("cpu") == accel.Selection("cpu", "explicit")
    assert accel.get_backend("cpu").name == "cpu"


def test_accel_beats_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEL", "  Recording ")
    assert accel.select_backend() == accel.Selection("recording", "ACCEL")
    assert accel.get_backend().name == "recording"


def test_blank_accel_means_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEL", "   ")
    assert accel.select_backend().reason in {"auto", "fallback"}


def test_auto_falls_back_to_cpu_without_accelerators() -> None:
    import torch

    if torch.cuda.device_count() > 0:
        pytest.skip("an accelerator is visible here; the fallback needs a CPU-only machine.")
    assert accel.select_backend() == accel.Selection("cpu", "fallback")


def test_auto_never_picks_negative_priority() -> None:
    names = {info.name for info in accel.list_backends() if info.priority < 0}
    assert "recording" in names
    assert accel.select_backend().name not in names


def test_same_name_same_instance() -> None:
    first = accel.get_backend("cpu")
    assert accel.get_backend("CPU") is first
    assert accel.get_backend() is first or accel.select_backend().name != "cpu"


def test_a_later_accel_change_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    assert accel.get_backend().name == accel.select_backend().name
    monkeypatch.setenv("ACCEL", "recording")
    assert accel.get_backend().name == "recording"


def test_reset_forgets_instances() -> None:
    first = accel.get_backend("cpu")
    accel.reset_backends()
    assert accel.get_backend("cpu") is not first


def test_concurrent_first_calls_discover_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real_discover = _select.discover

    def slow_discover() -> Catalog:
        calls.append(1)
        time.sleep(0.05)
        return real_discover()

    monkeypatch.setattr(_select, "discover", slow_discover)
    barrier = threading.Barrier(16)
    results: list[accel.Accelerator] = []

    def first_call() -> None:
        barrier.wait()
        results.append(accel.get_backend())

    threads = [threading.Thread(target=first_call) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    assert len(results) == 16 and all(r is results[0] for r in results)


def test_failed_factory_is_reported_and_nothing_is_cached(
    replace_spec: Callable[..., None],
) -> None:
    def broken() -> accel.Accelerator:
        raise OSError("driver went away")

    replace_spec("cpu", factory=broken)
    with pytest.raises(accel.BackendUnavailableError) as info:
        accel.get_backend("cpu")
    assert "could not be created: OSError: driver went away" in str(info.value)
    assert "cpu" not in _select._instances


def test_probe_that_raises_is_unavailable_not_fatal(replace_spec: Callable[..., None]) -> None:
    def exploding_probe() -> accel.Availability:
        raise RuntimeError("probe exploded")

    replace_spec("mps", probe=exploding_probe)
    row = next(info for info in accel.list_backends() if info.name == "mps")
    assert not row.available
    assert row.reason == "its availability check raised RuntimeError: probe exploded."
    assert accel.get_backend().name != "mps"


def test_probe_returning_the_wrong_type_is_unavailable(replace_spec: Callable[..., None]) -> None:
    replace_spec("mps", probe=lambda: True)
    row = next(info for info in accel.list_backends() if info.name == "mps")
    assert row.reason == "its availability check returned bool, not accel.Availability."


def test_import_and_get_backend_leave_cuda_uninitialised_and_vendors_unimported() -> None:
    code = """
import sys
import accel
backend = accel.get_backend()
accel.list_backends()
import torch
assert not torch.cuda.is_initialized(), "CUDA was initialised"
vendors = [m for m in sys.modules if m.split('.')[0] in
           {'habana_frameworks', 'intel_extension_for_pytorch', 'torch_npu', 'torch_xla'}]
assert not vendors, vendors
print(backend.name)
"""
    result = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    )
    assert result.stdout.strip() == accel.select_backend().name


def test_import_accel_does_not_import_torch() -> None:
    code = "import sys, accel; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
