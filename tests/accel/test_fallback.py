"""Auto-detection falls back when its pick fails to start; a name or ACCEL still raises."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import accel
from accel import BackendFallbackWarning, BackendUnavailableError
from backends.privateuse1 import UNREGISTERED_NAME, registered_device


def test_auto_detection_warns_once_and_takes_the_next(fallback_site: Path) -> None:
    assert accel.select_backend() == accel.Selection("fakefailing", "auto")
    expected_next = next(
        info.name
        for info in accel.list_backends()
        if info.available and info.priority >= 0 and info.name != "fakefailing"
    )
    with pytest.warns(BackendFallbackWarning) as caught:
        backend = accel.get_backend()
    assert backend.name == expected_next
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "'fakefailing'" in message
    assert "accel-fake-fallback 1.0" in message
    assert "RuntimeError: fake runtime refused to start" in message
    assert f"Auto-detection uses {expected_next!r} instead." in message
    # The warning points at this file, the caller, not at accel's own lines.
    assert caught[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert accel.get_backend() is backend
        selection = accel.select_backend()
    assert selection.name == expected_next
    assert selection.reason == ("fallback" if expected_next == "cpu" else "auto")
    assert selection.skipped == ("fakefailing: RuntimeError: fake runtime refused to start",)


def test_explicit_name_and_accel_raise_with_the_cause(
    fallback_site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(BackendUnavailableError) as info:
        accel.get_backend("fakefailing")
    assert "could not be created: RuntimeError: fake runtime refused to start" in str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)
    monkeypatch.setenv("ACCEL", "fakefailing")
    with pytest.raises(BackendUnavailableError) as info:
        accel.get_backend()
    assert isinstance(info.value.__cause__, RuntimeError)


def test_no_backend_left_raises_naming_what_failed(
    fallback_site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dataclasses import replace

    from accel import _select
    from accel._discovery import Catalog

    def broken_cpu() -> accel.Accelerator:
        raise OSError("no host")

    catalog = _select._loaded_catalog()
    entries = dict(catalog.entries)
    cpu = entries["cpu"]
    entries["cpu"] = replace(cpu, specs=(replace(cpu.spec, factory=broken_cpu),))
    for name in ("cuda", "hpu", "xla", "xpu", "mps", registered_device() or UNREGISTERED_NAME):
        del entries[name]
    monkeypatch.setattr(_select, "_catalog", Catalog(entries=entries, failures=()))
    with pytest.warns(BackendFallbackWarning), pytest.raises(BackendUnavailableError) as info:
        accel.get_backend()
    message = str(info.value)
    assert "No backend is usable here" in message
    assert "fakefailing: RuntimeError: fake runtime refused to start" in message
    assert "cpu: OSError: no host" in message
    assert isinstance(info.value.__cause__, BackendUnavailableError)


@pytest.mark.slow
def test_cli_says_what_happened(fallback_site: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEL")}
    env["PYTHONPATH"] = os.pathsep.join([str(fallback_site), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "accel"]
    table = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert table.returncode == 0, table.stderr
    assert "get_backend() would pick: cpu" in table.stdout
    assert (
        "skipped fakefailing: it could not be created: "
        "RuntimeError: fake runtime refused to start" in table.stdout
    )
    assert "BackendFallbackWarning" not in table.stderr
    report = json.loads(
        subprocess.run(
            [*command, "--json"], capture_output=True, text=True, env=env, timeout=600
        ).stdout
    )
    assert report["selected"]["name"] == "cpu"
    assert report["selected"]["skipped"] == [
        "fakefailing: RuntimeError: fake runtime refused to start"
    ]
