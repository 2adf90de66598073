"""The xla backend without torch_xla's runtime: host detection, state encoding, selection.

Detection reads a fake ``/dev`` and ``/sys`` tree; torch_xla need not be installed (its
presence is faked where a test needs it). What needs the runtime is in
``test_xla_device.py``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import accel
from backends import _xla_host, xla


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An empty fake host with torch_xla 'installed' and PJRT_DEVICE unset."""
    monkeypatch.setattr(xla, "_not_installed", lambda: None)
    monkeypatch.setattr(_xla_host, "FILESYSTEM_ROOT", str(tmp_path))
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    return tmp_path


def _pci(root: Path, address: str, vendor: str, device: str) -> None:
    node = root / "sys/bus/pci/devices" / address
    node.mkdir(parents=True)
    (node / "vendor").write_text(f"{vendor}\n")
    (node / "device").write_text(f"{device}\n")


def _neuron(root: Path, *names: str) -> None:
    (root / "dev").mkdir(exist_ok=True)
    for name in names:
        (root / "dev" / name).touch()


def test_no_device_keeps_cpu_and_offers_xla_by_name(host: Path) -> None:
    _pci(host, "0000:00:01.0", "0x8086", "0x1237")  # an Intel host bridge
    (host / "dev" / "accel").mkdir(parents=True)  # accel class, but no TPU behind it
    availability = xla._probe()
    assert availability.available and not availability.automatic
    assert "auto-detection keeps cpu" in (availability.reason or "")
    assert accel.select_backend().name == "cpu"
    row = next(info for info in accel.list_backends() if info.name == "xla")
    assert row.available and not row.automatic


@pytest.mark.parametrize("device_id", sorted(_xla_host.TPU_PCI_DEVICES))
def test_a_tpu_chip_is_picked(host: Path, device_id: str) -> None:
    _pci(host, "0000:00:04.0", "0x1ae0", device_id)
    availability = xla._probe()
    assert availability.available and availability.automatic and availability.device_count == 1
    assert accel.select_backend() == accel.Selection("xla", "auto")


def test_other_google_pci_devices_are_not_tpus(host: Path) -> None:
    _pci(host, "0000:00:03.0", "0x1ae0", "0x0042")  # e.g. a gVNIC
    assert not xla._probe().automatic


def test_neuron_nodes_are_counted(host: Path) -> None:
    _neuron(host, "neuron0", "neuron1", "neuron_ctl", "null")
    availability = xla._probe()
    assert availability.automatic and availability.device_count == 2
    assert _xla_host.scan(host).neuron_nodes == ("/dev/neuron0", "/dev/neuron1")


def test_pjrt_device_naming_another_client_is_by_name_only(
    host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _neuron(host, "neuron0")
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    availability = xla._probe()
    assert availability.available and not availability.automatic
    assert "PJRT_DEVICE=CPU" in (availability.reason or "")
    monkeypatch.setenv("PJRT_DEVICE", "neuron")
    assert xla._probe().automatic


def test_not_installed_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(xla, "VENDOR_PACKAGE", "torch_xla_not_installed_here")
    for probe in (xla._probe, xla._named_probe):
        availability = probe()
        assert not availability.available
        assert "torch_xla 2.9.0 pairs with torch 2.9.1" in (availability.reason or "")


def test_probe_and_listing_never_import_torch_xla() -> None:
    code = (
        "import sys, accel; accel.list_backends(); accel.get_backend(); "
        "assert 'torch_xla' not in sys.modules, 'torch_xla imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("seed", [0, 101, 3601076, 2**63 + 5, 2**64 - 1])
def test_seed_state_round_trip(seed: int) -> None:
    state = xla.seed_to_state(seed)
    assert state.dtype == torch.uint8 and state.shape == (8,)
    assert xla.state_to_seed(state) == seed


@pytest.mark.parametrize(
    "state", [torch.zeros(4, dtype=torch.uint8), torch.zeros(8), "seed"], ids=str
)
def test_a_foreign_state_is_refused_with_a_sentence(state: object) -> None:
    with pytest.raises(ValueError, match="8-element uint8 tensor get_rng_state"):
        xla.state_to_seed(state)  # type: ignore[arg-type]
