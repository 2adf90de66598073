"""Both frameworks in processes of their own: two-process DDP/ZeRO, one process per backend.

``scripts/two_processes.py`` runs under torchrun on 2 CPU processes (the Trainer's and
Fabric's DDP over gloo, then DeepSpeed ZeRO 1, 2, 3 and 3 with CPU offload);
``scripts/one_process.py`` runs the same in one process, once on the example
``reproducible_cpu`` plugin (``examples/accel-reproducible-cpu``, made importable here
with its entry point) and once on the ``recording`` backend (the cpu backend with every
protocol call recorded). Process-wide state (process groups, the plugin's deterministic
mode) stays in those processes; each run costs seconds of imports, so every
configuration shares these three.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

# Each test here starts processes or whole pytest sessions: deselected by default (see
# [tool.pytest.ini_options]).
pytestmark = pytest.mark.slow

pytest.importorskip("lightning", reason="Lightning is not installed (pip install '.[lightning]')")

REPO = Path(__file__).resolve().parents[3]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
PLUGIN = REPO / "examples" / "accel-reproducible-cpu"
TIMEOUT_S = 600  # a hang guard, generous for a loaded 2-core CI machine
TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR")


def _run(command: list[str], out: Path, **env: str) -> None:
    """Run ``command`` in its own session (killed with its workers on timeout)."""
    paths = [str(REPO), *env.pop("EXTRA_PATH", "").split(os.pathsep), os.environ.get("PYTHONPATH")]
    environment = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARIABLES}
    environment.update(env, PYTHONPATH=os.pathsep.join(filter(None, paths)), OMP_NUM_THREADS="1")
    log = out / "log.txt"
    with log.open("w") as handle:
        process = subprocess.Popen(
            command,
            env=environment,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = process.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            pytest.fail(f"{command[-2:]} ran past {TIMEOUT_S} s:\n{log.read_text()[-4000:]}")
    assert code == 0, f"{command[-2:]} failed:\n{log.read_text()[-4000:]}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _torchrun() -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={_free_port()}",
    ]


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("two_processes")
    _run(
        [*_torchrun(), str(SCRIPTS / "two_processes.py")], out, ACCEL="cpu", ACCEL_TEST_OUT=str(out)
    )
    return [torch.load(out / f"rank{rank}.pt", weights_only=True) for rank in range(2)]


@pytest.fixture(scope="module")
def plugin_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("reproducible_cpu")
    # The example plugin as pip would install it: its package and its entry point.
    info = out / "site" / "accel_reproducible_cpu-1.0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: accel-reproducible-cpu\nVersion: 1.0.0\n"
    )
    (info / "entry_points.txt").write_text(
        "[accel.backends]\nreproducible_cpu = accel_reproducible_cpu\n"
    )
    extra = os.pathsep.join([str(PLUGIN), str(out / "site")])
    return _one_process(out, ACCEL="reproducible_cpu", EXTRA_PATH=extra)


@pytest.fixture(scope="module")
def recording_run(tmp_path_factory: pytest.TempPathFactory, common: ModuleType) -> dict[str, Any]:
    if not common.deepspeed_installed():
        pytest.skip(common.DEEPSPEED_MISSING)
    # DeepSpeed alone: Lightning on the recording backend is tested in this process.
    out = tmp_path_factory.mktemp("recording")
    return _one_process(out, "deepspeed", ACCEL="recording")


def _one_process(out: Path, *frameworks: str, **env: str) -> dict[str, Any]:
    script = [sys.executable, str(SCRIPTS / "one_process.py"), str(out / "results.pt")]
    _run([*script, *frameworks], out, **env)
    return dict(torch.load(out / "results.pt", weights_only=True))


def _equal(got: list[torch.Tensor], expected: list[torch.Tensor]) -> bool:
    return all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def _close(got: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    for a, b in zip(got, expected, strict=True):
        # Gradients averaged over two half batches: all-reduce adds in another order.
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_lightning_ddp_over_gloo_ends_with_identical_weights(two: list[dict[str, Any]]) -> None:
    assert [r["strategy"] for r in two] == ["AccelDDPStrategy"] * 2
    assert [r["process_group_backend"] for r in two] == ["gloo"] * 2
    assert _equal(two[0]["lightning"], two[1]["lightning"])
    _close(two[0]["lightning"], two[0]["plain"])


def test_fabric_ddp_over_gloo_ends_with_identical_weights(two: list[dict[str, Any]]) -> None:
    assert [r["fabric_strategy"] for r in two] == ["AccelFabricDDPStrategy"] * 2
    assert _equal(two[0]["fabric"], two[1]["fabric"])
    _close(two[0]["fabric"], two[0]["plain"])


ZERO = ["zero1", "zero2", "zero3", "zero3_offload"]
# What each configuration must have run as: ZeRO stage, (optimizer, parameters) offloaded.
ENGINE = {
    "zero1": (1, (False, False)),
    "zero2": (2, (False, False)),
    "zero3": (3, (False, False)),
    "zero3_offload": (3, (True, True)),
}


@pytest.mark.parametrize("zero", ZERO)
def test_deepspeed_zero_on_two_processes_equals_a_plain_loop(
    two: list[dict[str, Any]], common: ModuleType, zero: str
) -> None:
    if not common.deepspeed_installed():
        pytest.skip(common.DEEPSPEED_MISSING)
    runs = [r[zero] for r in two]
    assert [(run["stage"], run["offload"]) for run in runs] == [ENGINE[zero]] * 2
    assert _equal(runs[0]["parameters"], runs[1]["parameters"])
    _close(runs[0]["parameters"], two[0]["plain"])


def test_the_example_plugin_trains_under_lightning(plugin_run: dict[str, Any]) -> None:
    assert plugin_run["backend"] == "reproducible_cpu"
    assert plugin_run["deterministic"]  # the plugin's own setting, applied on creation
    assert _equal(plugin_run["lightning"], plugin_run["plain"])
    assert _equal(plugin_run["fabric"], plugin_run["plain"])


@pytest.mark.parametrize("zero", ZERO)
def test_the_example_plugin_trains_under_deepspeed_zero(
    plugin_run: dict[str, Any], common: ModuleType, zero: str
) -> None:
    if not common.deepspeed_installed():
        pytest.skip(common.DEEPSPEED_MISSING)
    assert plugin_run["deepspeed_backend"] == "reproducible_cpu"
    run = plugin_run[zero]
    assert (run["stage"], run["offload"]) == ENGINE[zero]
    assert _equal(run["parameters"], plugin_run["plain"])


@pytest.mark.parametrize("zero", ZERO)
def test_deepspeed_zero_asks_the_installed_backend(
    recording_run: dict[str, Any], zero: str
) -> None:
    assert recording_run["backend"] == recording_run["deepspeed_backend"] == "recording"
    run = recording_run[zero]
    assert (run["stage"], run["offload"]) == ENGINE[zero]
    assert _equal(run["parameters"], recording_run["plain"])
    # DeepSpeed placed the model and queued its work through accel's backend.
    assert {"device", "set_device", "current_stream"} <= set(run["calls"]), run["calls"]


def test_install_after_deepspeed_set_up_communication_warns(
    plugin_run: dict[str, Any], common: ModuleType
) -> None:
    if not common.deepspeed_installed():
        pytest.skip(common.DEEPSPEED_MISSING)
    [warning] = plugin_run["late_warnings"]
    assert warning.startswith("DeepSpeedInstallWarning: accel.integrations.deepspeed: install()")
    assert "Call install() before deepspeed.init_distributed()" in warning


# Appended to each torchrun example: one write per rank (both ranks share the log, and CI
# runs unbuffered, so a print of several pieces interleaves with the other rank's). Then
# the rank leaves without interpreter teardown: the example's own ending (barrier,
# destroy_process_group) has run, and what could still go wrong is torch's, not the
# example's: a gloo worker thread dropping a finished collective while Python shuts down
# aborts the process now and then (docs/deepspeed-zero3.md says when).
REPORT = """
import os, sys

ds = sys.modules.get("deepspeed")
name = type(ds.get_accelerator()).__name__ if ds else "none"
os.write(1, f"rank {os.environ['RANK']} done, deepspeed accelerator: {name}\\n".encode())
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
"""
TORCHRUN_BLOCKS = [
    block
    for block in sys.modules["docs_blocks"].python_blocks()
    if (block.skip_reason or "").startswith("needs torchrun")
]


@pytest.mark.parametrize("block", TORCHRUN_BLOCKS, ids=[block.name for block in TORCHRUN_BLOCKS])
def test_the_docs_torchrun_examples_run_under_torchrun(
    block: Any, common: ModuleType, tmp_path: Path
) -> None:
    """The blocks tests/test_docs.py skips as needing torchrun, run on 2 CPU processes."""
    if "deepspeed" in block.code and not common.deepspeed_installed():
        pytest.skip(common.DEEPSPEED_MISSING)
    script = tmp_path / "train.py"
    script.write_text(block.code + REPORT)
    _run([*_torchrun(), str(script)], tmp_path, ACCEL="cpu")
    log = (tmp_path / "log.txt").read_text()
    accelerator = "AccelDeepSpeedAccelerator" if "deepspeed" in block.code else "none"
    for rank in range(2):
        assert f"rank {rank} done, deepspeed accelerator: {accelerator}" in log, log[-4000:]


def test_the_torchrun_examples_are_found() -> None:
    pages = {block.page.name for block in TORCHRUN_BLOCKS}
    assert {"deepspeed.md", "distributed.md"} <= pages
