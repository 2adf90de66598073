"""HPU availability: the probe reads device nodes and sysfs; naming hpu asks the bridge."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

import accel
import backends.hpu
from backends import _gaudi_nodes
from backends.hpu import HpuBackend

# Loaded by tests/conftest.py (tests/doubles stays off sys.path).
habana_double_helpers = sys.modules["habana_double"]
DOUBLES_DIR = Path(__file__).resolve().parents[1] / "doubles"
REPO_ROOT = Path(__file__).resolve().parents[2]
make_device_tree = habana_double_helpers.make_device_tree


def _vendor_modules() -> list[str]:
    return sorted(name for name in sys.modules if name.split(".")[0] == "habana_frameworks")


def _use_tree(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    monkeypatch.setattr(backends.hpu, "FILESYSTEM_ROOT", str(root))
    accel.reset_backends()


# The node scan on fake trees ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("tree", "gaudi", "others"),
    [
        ({"gaudi": 2}, ["/dev/accel/accel0", "/dev/accel/accel1"], []),
        ({"gaudi": 0, "npu": 1}, [], ["/dev/accel/accel0 (intel_vpu)"]),
        ({"gaudi": 1, "npu": 1}, ["/dev/accel/accel0"], ["/dev/accel/accel1 (intel_vpu)"]),
        ({"gaudi": 0, "old_gaudi": 2}, ["/dev/hl0", "/dev/hl1"], []),
        ({"gaudi": 0, "vendor_only": 1}, ["/dev/accel/accel0"], []),
        ({"gaudi": 0}, [], []),
    ],
    ids=["two-gaudi", "intel-npu-only", "gaudi-and-npu", "old-hl-nodes", "vendor-id", "none"],
)
def test_scan_counts_only_habanalabs_nodes(
    tmp_path: Path, tree: dict[str, int], gaudi: list[str], others: list[str]
) -> None:
    found = _gaudi_nodes.scan(make_device_tree(tmp_path, **tree))
    assert list(found.gaudi) == gaudi
    assert list(found.others) == others


def test_control_nodes_alone_are_not_devices(tmp_path: Path) -> None:
    (tmp_path / "dev" / "accel").mkdir(parents=True)
    (tmp_path / "dev" / "accel" / "accel_controlD64").touch()
    (tmp_path / "dev" / "hl_controlD0").touch()
    assert _gaudi_nodes.scan(tmp_path) == _gaudi_nodes.NodeScan((), ())


def test_a_node_without_sysfs_entry_is_not_counted(tmp_path: Path) -> None:
    (tmp_path / "dev" / "accel").mkdir(parents=True)
    (tmp_path / "dev" / "accel" / "accel0").touch()
    found = _gaudi_nodes.scan(tmp_path)
    assert found.gaudi == ()
    assert found.others == (
        "/dev/accel/accel0 (driver unknown: sysfs has no driver link or PCI vendor for it)",
    )


def test_another_vendor_id_is_not_counted(tmp_path: Path) -> None:
    make_device_tree(tmp_path, gaudi=0, vendor_only=1)
    (tmp_path / "sys/class/accel/accel0/device/vendor").write_text("0x8086\n")
    assert _gaudi_nodes.scan(tmp_path).others == ("/dev/accel/accel0 (PCI vendor 0x8086)",)


# Auto-detection ---------------------------------------------------------------------------


def test_an_intel_npu_node_does_not_make_hpu_available(
    habana_double: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Issue 10, item 1: a generic accel node used to select hpu, whose factory then failed.
    _use_tree(monkeypatch, make_device_tree(tmp_path / "npu", gaudi=0, npu=1))

    [row] = [info for info in accel.list_backends() if info.name == "hpu"]
    assert row.available is False
    assert "no device node of the habanalabs driver" in (row.reason or "")
    assert "/dev/accel/accel0 (intel_vpu)" in (row.reason or "")
    assert accel.select_backend() == accel.Selection("cpu", "fallback")
    assert accel.get_backend().name == "cpu"
    assert _vendor_modules() == ["habana_frameworks", "habana_frameworks._double"]


def test_auto_detection_picks_hpu_when_a_gaudi_node_exists(habana_double: ModuleType) -> None:
    assert accel.select_backend() == accel.Selection("hpu", "auto")
    backend = accel.get_backend()
    assert isinstance(backend, HpuBackend)
    assert backend is accel.get_backend("hpu")

    [row] = [info for info in accel.list_backends() if info.name == "hpu"]
    assert row.available is True
    assert row.device_count == 1


def test_eight_cards_are_listed_as_one_device_per_process(
    habana_double: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _use_tree(monkeypatch, make_device_tree(tmp_path / "hls", gaudi=8))
    [row] = [info for info in accel.list_backends() if info.name == "hpu"]
    assert (row.available, row.device_count) == (True, 1)


def test_missing_package_makes_hpu_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        sys, "path", [entry for entry in sys.path if Path(entry or ".").resolve() != DOUBLES_DIR]
    )
    for name in _vendor_modules():
        monkeypatch.delitem(sys.modules, name)
    importlib.invalidate_caches()
    accel.reset_backends()

    with pytest.raises(accel.BackendUnavailableError) as excinfo:
        accel.get_backend("hpu")

    message = str(excinfo.value)
    assert "habana_frameworks is not installed" in message
    assert "Available: cpu" in message
    assert _vendor_modules() == []


# Naming hpu asks the bridge -----------------------------------------------------------------


def test_named_hpu_works_with_the_bridge_and_no_device_node(
    habana_double: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Issue 10, item 2: a renamed node, a new device class or a simulator.
    _use_tree(monkeypatch, tmp_path / "empty")
    assert accel.select_backend() == accel.Selection("cpu", "fallback")
    assert "habana_frameworks.torch" not in sys.modules

    backend = accel.get_backend("hpu")

    assert isinstance(backend, HpuBackend)
    assert backend.device_count() == 1
    assert habana_double.call_names().count("hpu.is_available") >= 1


def test_accel_variable_also_asks_the_bridge(
    habana_double: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _use_tree(monkeypatch, tmp_path / "empty")
    monkeypatch.setenv("ACCEL", "hpu")
    assert accel.select_backend() == accel.Selection("hpu", "ACCEL")
    assert accel.get_backend().name == "hpu"


def test_named_hpu_is_refused_when_the_bridge_sees_no_card(
    habana_double: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _use_tree(monkeypatch, tmp_path / "empty")
    habana_double.DEVICE_COUNT = 0
    with pytest.raises(accel.BackendUnavailableError) as excinfo:
        accel.get_backend("hpu")
    message = str(excinfo.value)
    assert "habana_frameworks.torch.hpu.is_available() is false" in message
    assert "Available: cpu" in message


def test_named_hpu_with_a_bridge_built_for_another_torch(
    habana_double: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    habana_double.BUILT_FOR_TORCH = "1.0"
    _use_tree(monkeypatch, make_device_tree(tmp_path / "npu", gaudi=0, npu=1))

    with pytest.raises(accel.BackendUnavailableError) as excinfo:
        accel.get_backend("hpu")

    message = str(excinfo.value)
    assert "importing habana_frameworks.torch failed with AssertionError" in message
    assert "built for torch 1.0" in message
    assert accel.get_backend().name == "cpu"


_HYGIENE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import backends.hpu

    def vendor():
        return sorted(m for m in sys.modules if m.split(".")[0] == "habana_frameworks")

    backends.hpu.FILESYSTEM_ROOT = sys.argv[1]
    import accel
    result = {"after_import": vendor()}
    rows = {row.name: row.available for row in accel.list_backends()}
    result["list_hpu_available"] = rows["hpu"]
    result["after_list"] = vendor()
    result["picked"] = accel.get_backend().name
    result["after_get_backend"] = vendor()

    backends.hpu.FILESYSTEM_ROOT = sys.argv[2]
    accel.reset_backends()
    rows = {row.name: row.available for row in accel.list_backends()}
    result["list_hpu_available_with_nodes"] = rows["hpu"]
    result["after_list_with_nodes"] = vendor()
    print(json.dumps(result))
    """
)


def _subprocess_env(*extra_path: Path) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("ACCEL", "PT_HPU", "TORCH_DEVICE_BACKEND"))
    }
    env["PYTHONPATH"] = os.pathsep.join(
        [*map(str, extra_path), str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    return env


def test_probing_imports_nothing_of_habana_frameworks(tmp_path: Path) -> None:
    npu_only = make_device_tree(tmp_path / "npu", gaudi=0, npu=1)
    gaudi = make_device_tree(tmp_path / "gaudi", gaudi=1)

    completed = subprocess.run(
        [sys.executable, "-c", _HYGIENE_SCRIPT, str(npu_only), str(gaudi)],
        env=_subprocess_env(DOUBLES_DIR),
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr
    result = json.loads(completed.stdout.strip().splitlines()[-1])

    assert result == {
        "after_import": [],
        "list_hpu_available": False,
        "after_list": [],
        "picked": "cpu",
        "after_get_backend": [],
        "list_hpu_available_with_nodes": True,
        "after_list_with_nodes": [],
    }


def test_named_probe_must_be_callable() -> None:
    with pytest.raises(TypeError, match="named_probe must be callable or None, got str"):
        accel.BackendSpec(
            name="x",
            factory=HpuBackend,
            probe=lambda: accel.Availability(available=True, device_count=1),
            named_probe="yes",  # type: ignore[arg-type]
        )


def test_listing_uses_the_node_scan_even_after_naming_hpu(
    habana_double: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The named probe is for the name only: auto-detection never trusts the bridge's
    # import having happened.
    _use_tree(monkeypatch, tmp_path / "empty")
    accel.get_backend("hpu")
    [row] = [info for info in accel.list_backends() if info.name == "hpu"]
    assert row.available is False
    assert accel.select_backend() == accel.Selection("cpu", "fallback")
