"""The GPU proof's logic on CPU: targets read from JSON, out-of-memory as a result, budgets,
the no-index install plan, stdout-only JSON and per-step containment.

What needs a GPU (the benchmarks' figures, fairscale's out-of-memory under the cap) runs
only in ``bash benchmarks/gpu_proof.sh`` on a CUDA machine; CI runs its ``--dry-run``.
"""

from __future__ import annotations

import copy
import importlib.metadata
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _benchmarks_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))


def _write(path: Path, document: dict[str, Any]) -> Path:
    path.write_text(json.dumps(document))
    return path


def test_targets_are_read_from_the_json_met_missed_or_not_proven(tmp_path: Path) -> None:
    from _proof_targets import verdicts

    offload = _write(
        tmp_path / "offload.json",
        {
            "benchmark": "offload",
            "targets": {"overlap_efficiency": {"value": 0.4, "target": 0.85, "met": False}},
            "fairscale": {"result": "not installed"},
        },
    )
    checkpoint = _write(
        tmp_path / "checkpoint.json",
        {
            "benchmark": "checkpoint",
            "targets": {"non-reentrant": {"time": {"value": 1.01, "target": 1.02, "met": True}}},
        },
    )
    found = {(v.benchmark, v.target): v for v in verdicts([offload, checkpoint])}
    assert found["offload", "overlap_efficiency"].verdict == "MISSED"
    assert found["offload", "speedup_vs_fairscale"].verdict == "NOT PROVEN"
    assert "not installed" in found["offload", "speedup_vs_fairscale"].detail
    assert found["checkpoint", "non-reentrant.time"].verdict == "met"
    # Older JSON without the floor, retry and FSDP2 targets: each one NOT PROVEN.
    assert found["offload", "step_over_floor"].verdict == "NOT PROVEN"
    assert found["offload", "allocator_retries"].verdict == "NOT PROVEN"
    expected = {(v.target, v.verdict) for v in verdicts([offload], without_fairscale=True)}
    assert ("overlap_efficiency", "MISSED") in expected
    assert ("speedup_vs_fairscale", "not expected") in expected
    assert ("faster_than_fsdp2", "NOT PROVEN") in expected


def test_fsdp2_that_could_not_run_is_not_proven_with_its_reason(tmp_path: Path) -> None:
    from _proof_targets import verdicts

    offload = _write(
        tmp_path / "offload.json",
        {
            "benchmark": "offload",
            "targets": {
                "faster_than_fsdp2": {"value": None, "target": "< 1", "met": None},
                "allocator_retries": {"value": 0, "target": 0, "met": True},
                "step_over_floor": {"value": 1.3, "target": "<= 1.15", "met": False},
            },
            "fsdp2": {"result": "out of memory under the 3 GiB cap"},
        },
    )
    found = {v.target: v for v in verdicts([offload], without_fairscale=True)}
    assert found["faster_than_fsdp2"].verdict == "NOT PROVEN"
    assert found["allocator_retries"].verdict == "met"
    assert found["step_over_floor"].verdict == "MISSED"
    # A target absent from the JSON takes its reason from the comparison's record.
    del offload
    bare = _write(tmp_path / "bare.json", {"benchmark": "offload", "fsdp2": {"result": "failed"}})
    missing = {v.target: v for v in verdicts([bare], without_fairscale=True)}
    assert missing["faster_than_fsdp2"].detail == "failed"


def test_fairscale_out_of_memory_is_recorded_and_retried_under_a_raised_cap() -> None:
    from _offload_compare import speedup_target, time_under_caps

    caps: list[float] = []
    released: list[float] = []

    def build() -> str:
        if caps[-1] < 4:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 256.00 MiB")
        return "model"

    times, record = time_under_caps(
        [3.0, 6.0], build, lambda model: [2.0, 2.0], caps.append, lambda: released.append(1)
    )
    assert times == [2.0, 2.0] and caps == [3.0, 6.0] and len(released) == 2
    assert record["attempts"][0]["outcome"] == "out of memory"
    assert "Tried to allocate" in record["attempts"][0]["error"]
    assert record["result"] == "out of memory under the 3 GiB cap; timed under 6 GiB"
    target = speedup_target(2.0, 0.5, record, 2.5)
    assert target["met"] is True and "3 GiB" in target["note"]

    never, record = time_under_caps([3.0], build, lambda model: [1.0], caps.append, lambda: 0)
    assert never is None and record["result"].startswith("out of memory under every cap")
    assert speedup_target(None, 0.5, record, 2.5)["met"] is None  # NOT PROVEN


def test_dry_run_plan_lists_wheels_and_every_budget(capsys: pytest.CaptureFixture[str]) -> None:
    import gpu_proof

    gpu_proof.print_plan(gpu_proof.parse_args(["--dry-run"]))
    out = capsys.readouterr().out
    assert "fairscale-0.4.13-py3-none-any.whl" in out and "numpy" in out
    assert 'carry: [".whl"]' in out
    for name, limit in gpu_proof.LIMITS.items():
        assert f"{name.ljust(16)} {limit:4d} s" in out
    # bench-offload, the main result, runs first among the GPU steps, and alone in
    # --part offload, which fits one 10-minute command with every setup step.
    assert gpu_proof.PARTS["all"][0] == "bench-offload"
    assert gpu_proof.PARTS["offload"] == ("bench-offload",)
    assert gpu_proof.LIMITS["bench-offload"] + 30 < 540  # the setup took 19 s on the H100
    assert "deepspeed" in out and "deepspeed" in gpu_proof.SETUP
    assert "--d-model" in gpu_proof.GPU_STEPS["bench-checkpoint"]


def test_steps_get_the_root_on_pythonpath_json_from_stdout_and_fail_alone(
    tmp_path: Path,
) -> None:
    import gpu_proof

    runner = gpu_proof.Runner(gpu_proof.parse_args(["--dry-run"]))
    assert runner.env["PYTHONPATH"].split(os.pathsep)[0] == str(REPO)

    def broken(step: gpu_proof.Step) -> None:
        raise KeyError("backends")

    seen: dict[str, Any] = {}

    def reads_stdout(step: gpu_proof.Step) -> None:
        script = (
            "import json, os, sys; print('a warning', file=sys.stderr); print('noise'); "
            "print(json.dumps({'path': os.environ['PYTHONPATH']}))"
        )
        done = runner.run(step, [sys.executable, "-c", script])
        assert done is not None
        seen.update(gpu_proof.last_json(done.stdout))

    first = runner.step("plugins", broken)
    second = runner.step("environment", reads_stdout)
    assert first.status == "failed" and "KeyError" in first.reason
    assert second.status == "passed" and second.limit_s == gpu_proof.LIMITS["environment"]
    assert seen["path"].split(os.pathsep)[0] == str(REPO)
    shutil.rmtree(runner.workdir)


def test_install_plan_needs_no_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import _proof_install as provision

    assert any(r.startswith("setuptools") for r in provision.build_requirements())
    assert provision.unmet_build_requirements(["setuptools>=9999"])[0].startswith(
        "setuptools>=9999 (installed: "
    )
    (tmp_path / "accel_hal-0.1.0-py3-none-any.whl").write_bytes(b"")
    commands, advice = provision.install_commands("python", tmp_path)
    assert all("--no-index" in command for command in commands)
    assert commands[0][-1].endswith("accel_hal-0.1.0-py3-none-any.whl")
    assert "pip download 'setuptools>=" in advice and "pip wheel --no-deps ." in advice

    real_version = importlib.metadata.version

    def no_numpy(name: str) -> str:
        if name == "numpy":
            raise importlib.metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(importlib.metadata, "version", no_numpy)
    chosen, missing = provision.fairscale_wheels(tmp_path)
    assert chosen == [] and len(missing) == 2 and "numpy" in missing[1]
    (tmp_path / "fairscale-0.4.13-py3-none-any.whl").write_bytes(b"")
    (tmp_path / "numpy-2.5.2-cp312-cp312-manylinux_2_27_x86_64.whl").write_bytes(b"")
    chosen, missing = provision.fairscale_wheels(tmp_path)
    assert [path.name.split("-")[0] for path in chosen] == ["fairscale", "numpy"] and not missing


def test_bench_offload_times_ours_first_and_records_fairscale_out_of_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # bench_offload's device mode on CPU: a host backend that claims streams, a stand-in
    # for fairscale that runs out of memory under the first cap, and the cap recorded.
    import gc
    import types

    import _offload_device
    import _offload_measure
    import bench_offload
    from torch import nn

    from backends.cpu import CpuBackend

    events: list[str] = []
    caps: list[int] = []

    class Streaming(CpuBackend):
        supports_streams = True  # type: ignore[assignment]

    class FakeFairscale(nn.Module):
        def __init__(self, model: nn.Module, **options: Any) -> None:
            super().__init__()
            self.model = model
            events.append(f"fairscale built under {caps[-1]}")

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if caps[-1] < 2 * caps[0]:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB")
            return self.model(x)

    module = types.ModuleType("fairscale.experimental.nn.offload")
    module.OffloadModel = FakeFairscale  # type: ignore[attr-defined]
    for name in ("fairscale", "fairscale.experimental", "fairscale.experimental.nn"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "fairscale.experimental.nn.offload", module)
    monkeypatch.setattr(_offload_measure, "limit_device_memory", lambda b, cap: caps.append(cap))
    ours = _offload_device.OffloadModel

    def recorded_ours(*args: Any, **kwargs: Any) -> Any:
        events.append("ours built")
        return ours(*args, **kwargs)

    monkeypatch.setattr(_offload_device, "OffloadModel", recorded_ours)
    monkeypatch.setattr(gc, "collect", lambda *args: 0)  # a full collection is slow here
    args = bench_offload.parse_args(
        ["--budget-gib", str(2**-20), "--blocks", "2", "--width", "16", "--tokens", "8",
         "--microbatches", "1", "--steps", "1", "--fairscale-retry-gib", str(2**-19)]
    )  # fmt: skip
    payload = _offload_device.device_mode(Streaming(), args)

    assert events == ["ours built", "fairscale built under 1024", "fairscale built under 2048"]
    attempts = payload["fairscale"]["attempts"]
    assert [a["outcome"] for a in attempts] == ["out of memory", "timed"]
    assert "Tried to allocate" in attempts[0]["error"]
    assert "out of memory under the" in payload["targets"]["speedup_vs_fairscale"]["note"]
    assert set(payload["median_step_s"]) >= {"offload.OffloadModel", "fairscale OffloadModel"}
    # Every target of a device run is judged, each as met, missed or not proven (None).
    assert set(payload["targets"]) == {
        "step_over_floor", "overlap_efficiency", "allocator_retries",
        "backward_allocations_on_device", "faster_than_fsdp2", "speedup_vs_fairscale",
    }  # fmt: skip
    assert payload["targets"]["allocator_retries"]["met"] is None  # no CUDA counter here
    summary = payload["summary"]
    assert summary["fairscale_speedup"] == payload["targets"]["speedup_vs_fairscale"]["value"]
    assert summary["step_over_floor"] == pytest.approx(
        payload["median_step_s"]["offload.OffloadModel"] / payload["copy_floor"]["floor_s"]
    )
    # The full step: the same host optimizer for every wrapper, timed apart.
    assert set(payload["median_optimizer_s"]) >= {"offload.OffloadModel", "fairscale OffloadModel"}


def test_bench_offload_times_fsdp2_under_a_raised_cap_when_it_runs_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # FSDP2 does not fit the 3 GiB cap on the GPU model: it is timed again under the
    # raised cap, the record says so, and our cap is back in force afterwards.
    import _offload_compare
    import _offload_measure
    import _offload_peers
    import bench_offload
    from torch import nn

    from backends.cpu import CpuBackend

    caps: list[int] = []
    built: list[int] = []
    monkeypatch.setattr(_offload_measure, "limit_device_memory", lambda b, cap: caps.append(cap))

    def build(reference: nn.Module, device: torch.device, **options: Any) -> nn.Module:
        built.append(caps[-1])
        if caps[-1] < 2 * caps[0]:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 256 MiB")
        return copy.deepcopy(reference)

    monkeypatch.setattr(_offload_peers, "build_fsdp2", build)
    args = bench_offload.parse_args(
        ["--budget-gib", str(2**-20), "--steps", "1", "--fairscale-retry-gib", str(2**-19)]
    )
    reference = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    times, record = _offload_compare.compare_fsdp2(CpuBackend(), reference, torch.randn(2, 4), args)

    assert times is not None and built == [1024, 2048]
    assert [a["outcome"] for a in record["attempts"]] == ["out of memory", "timed"]
    assert "Tried to allocate" in record["attempts"][0]["error"]
    assert (
        record["result"]
        == "out of memory under the 9.53674e-07 GiB cap; timed under 1.90735e-06 GiB"
    )
    assert caps[-1] == 1024  # the budget again, for the peers after it

    # Out of memory under every cap: no times, and the result names the caps tried.
    monkeypatch.setattr(_offload_measure, "limit_device_memory", lambda b, cap: caps.append(1))
    times, record = _offload_compare.compare_fsdp2(CpuBackend(), reference, torch.randn(2, 4), args)
    assert times is None and record["result"].startswith("out of memory under every cap tried")


def test_copy_floor_is_the_loads_on_their_own_copy_engine() -> None:
    from _offload_measure import copy_floor

    # The H100 figures: 12.9 GB of parameters, 54.7 GB/s each way.
    floor = copy_floor(12_886_867_968, 54.7e9, 54.7e9)
    assert floor["load_bytes"] == 2 * 12_886_867_968
    assert floor["floor_s"] == floor["loads_s"] == pytest.approx(0.471, abs=1e-3)
    assert floor["stores_s"] == pytest.approx(floor["loads_s"] / 2)
    # Slow stores set the floor when they take longer than the loads.
    assert copy_floor(100, 200.0, 10.0)["floor_s"] == 10.0


@pytest.mark.slow
def test_smoke_run_writes_the_summary_with_a_reason_for_every_missing_figure(
    tmp_path: Path,
) -> None:
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_offload.py"), "--smoke",
         "--results-dir", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (written,) = tmp_path.glob("offload-smoke-*.json")
    document = json.loads(written.read_text())
    summary = document["summary"]
    keys = ("step_over_floor", "overlap_efficiency", "allocator_retries",
            "backward_allocations", "backward_allocations_on_device", "fsdp2_step_ratio",
            "fairscale_speedup", "device")  # fmt: skip
    assert set(keys) <= set(summary)
    for key in keys:
        assert summary[key] is not None or summary["reasons"][key].endswith(".")
    assert summary["device"] and document["machine"]["torch"] == torch.__version__
    # FSDP2 either ran or said why not; so did DeepSpeed.
    assert document["fsdp2"]["result"] and document["deepspeed"]["result"]
    assert "offload.OffloadModel" in document["median_optimizer_s"]


def test_deepspeed_child_gives_its_json_or_says_why_not(tmp_path: Path) -> None:
    # DeepSpeed runs in a child process: its JSON line when it works, and a sentence with
    # the exit status or the time limit when it does not, never an exception.
    from _offload_peers import deepspeed_status, run_deepspeed_child

    script = tmp_path / "child.py"
    script.write_text(
        "import json, sys, time\n"
        "mode = sys.argv[sys.argv.index('--mode') + 1]\n"
        "if mode == 'ok': print('a log line {'); print(json.dumps({'result': 'timed'}))\n"
        "if mode == 'fail': sys.exit('DeepSpeed broke')\n"
        "if mode == 'hang': time.sleep(30)\n"
    )
    assert run_deepspeed_child(script, ["--mode", "ok"], 60) == {"result": "timed"}
    failed = run_deepspeed_child(script, ["--mode", "fail"], 60)["result"]
    assert failed == "failed with exit status 1: DeepSpeed broke"
    hung = run_deepspeed_child(script, ["--mode", "hang"], 1)["result"]
    assert hung.startswith("timed out after 1 s")
    assert deepspeed_status("cpu") is not None  # never attempted on the host


def test_offload_plot_draws_the_h100_run_and_names_what_it_lacks(tmp_path: Path) -> None:
    import plot_offload

    results = REPO / "benchmarks" / "results"
    result = json.loads((results / "offload-cuda-20261127.json").read_text())
    caps = json.loads((results / "offload-caps-cuda-20261127.json").read_text())
    bars, missing = plot_offload.step_bars(result, caps)
    drawn = dict(bars)
    assert round(drawn["offload.OffloadModel\nunder 3 GiB"]) == 957
    assert round(drawn["fairscale OffloadModel\nunder 6 GiB"]) == 2211
    assert round(plot_offload.floor_ms(result)) == 471  # the 25.8 GB / 54.7 GB/s
    assert missing == [
        "FSDP2 CPUOffloadPolicy: to be measured",
        "DeepSpeed ZeRO-3 offload: to be measured",
    ]
    out = tmp_path / "offload.png"
    plot_offload.draw(result, caps, out, "NVIDIA H100 80GB HBM3")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_peer_starts_after_the_deadline_and_the_json_is_still_written(
    tmp_path: Path,
) -> None:
    import bench_offload

    threads = torch.get_num_threads()  # the smoke run sets one thread: restored after
    try:
        bench_offload.main(["--smoke", "--results-dir", str(tmp_path), "--deadline-s", "1e-9"])
    finally:
        torch.set_num_threads(threads)
    (written,) = tmp_path.glob("offload-smoke-*.json")
    document = json.loads(written.read_text())
    for peer in ("fsdp2", "fairscale", "deepspeed"):
        assert document[peer]["result"].startswith("not attempted: past the run's deadline")
    assert "offload.OffloadModel" in document["median_step_s"]
    assert document["summary"]["reasons"]["fsdp2_step_ratio"].startswith("FSDP2: not attempted")


def test_part_budget_runs_the_setup_then_bench_budget_at_the_gpu_size_in_one_command() -> None:
    import _zoo
    import bench_budget
    import gpu_proof

    assert gpu_proof.PARTS["budget"] == ("bench-budget",)
    assert "bench-budget" in gpu_proof.PARTS["all"]
    assert gpu_proof.step_names("budget") == ["environment", "install", "plugins", "bench-budget"]
    assert gpu_proof.step_names("offload") == [*gpu_proof.SETUP, "bench-offload"]
    # Without bench-offload, fairscale and deepspeed are skipped: the setup took 19 s on
    # the H100, and the default budget (540 s) fits a 10-minute command.
    assert gpu_proof.LIMITS["bench-budget"] + 30 < gpu_proof.parse_args([]).budget_s < 600
    command = gpu_proof.GPU_STEPS["bench-budget"]
    assert command[:2] == ["{python}", "benchmarks/bench_budget.py"]
    args = bench_budget.parse_args(command[2:])
    assert (args.backend, args.size, args.steps) == ("cuda", "gpu", 3)
    assert args.model.split(",") == list(gpu_proof.BUDGET_FAMILIES)
    # Every family the proof asks for has a gpu size: none falls back to its bench size.
    assert set(gpu_proof.BUDGET_FAMILIES) <= set(_zoo.GPU_SIZED)


def test_bench_budget_step_is_skipped_without_a_gpu_and_records_its_command() -> None:
    import gpu_proof

    runner = gpu_proof.Runner(gpu_proof.parse_args(["--dry-run", "--part", "budget"]))
    body = gpu_proof.gpu_step(gpu_proof.GPU_STEPS["bench-budget"])
    step = runner.step("bench-budget", lambda step: body(runner, step))
    assert step.status == "skipped" and step.reason == "no GPU (dry run)"
    assert step.command == gpu_proof.GPU_STEPS["bench-budget"]
    assert step.limit_s == gpu_proof.LIMITS["bench-budget"]
    shutil.rmtree(runner.workdir)


def _half(measured: float, estimate: float, **changes: Any) -> dict[str, Any]:
    summary = {
        "bytes_ratio": 0.49,
        "measured": measured,
        "estimate": estimate,
        "estimate_error": abs(estimate - measured),
        "time_target": 1.15,
        "time_met": measured <= 1.15,
        "fits": True,
        "exact": True,
        "bit_equal": True,
        "grad_difference": 0.0,
    }
    return {**summary, **changes}


def test_budget_summary_gives_each_family_met_missed_or_not_proven(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from _proof_targets import print_verdicts, verdicts

    rule = "bit-equal or within 0.0001"
    document = {
        "benchmark": "budget-gpu-gpt2-resnet-llama",
        "size": "gpu",
        "requested": ["gpt2", "resnet", "llama", "bert", "shared"],
        "skipped": {"shared": "transformers is not installed"},
        "models": [
            {
                "model": "gpt2",
                "size": "gpu",
                "exact_rule": rule,
                "plain_rerun_difference": 3e-7,
                "summary_at_half": _half(
                    1.08, 1.05, exact=True, bit_equal=False, grad_difference=2e-7
                ),
            },
            {
                "model": "resnet",
                "size": "gpu",
                "exact_rule": rule,
                "summary_at_half": _half(
                    1.25, 1.1, time_target=1.2, time_met=False, fits=False, bytes_ratio=0.6
                ),
            },
            {
                "model": "llama",
                "size": "gpu",
                "summary_at_half": None,
                "unavailable": {"budget 0.5": "plan_checkpointing raised: too small"},
            },
        ],
    }
    found = {v.target: v for v in verdicts([_write(tmp_path / "budget.json", document)])}
    assert {v.benchmark for v in found.values()} == {"budget-gpu"}
    assert found["gpt2.time"].verdict == "met"
    assert "measured 1.08x, estimate 1.05x" in found["gpt2.time"].detail
    assert "<= 1.15x" in found["gpt2.time"].detail
    assert found["gpt2.budget"].verdict == "met"
    assert found["gpt2.exact"].verdict == "met"
    assert rule in found["gpt2.exact"].detail and "2.0e-07" in found["gpt2.exact"].detail
    assert "plain against itself 3.0e-07" in found["gpt2.exact"].detail
    assert found["resnet.time"].verdict == "MISSED" and "<= 1.20x" in found["resnet.time"].detail
    assert found["resnet.budget"].verdict == "MISSED"
    assert found["resnet.exact"].verdict == "met"
    assert found["llama.budget 0.5"].verdict == "NOT PROVEN"
    assert "too small" in found["llama.budget 0.5"].detail
    assert found["bert.budget 0.5"].verdict == "NOT PROVEN"
    assert "stopped before this family" in found["bert.budget 0.5"].detail
    assert "transformers is not installed" in found["shared.budget 0.5"].detail
    fails = {target for target, v in found.items() if v.fails}
    assert fails == {
        "resnet.time", "resnet.budget", "llama.budget 0.5", "bert.budget 0.5",
        "shared.budget 0.5",
    }  # fmt: skip
    print_verdicts(list(found.values()))
    assert "gpt2.time" in capsys.readouterr().out


def test_zoo_gpu_size_falls_back_with_a_line_and_reaches_the_builders(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import _zoo

    assert _zoo.gpu_size("gpt2", "gpu") == ("gpu", None)
    assert _zoo.gpu_size("convnext", "bench") == ("bench", None)
    size, line = _zoo.gpu_size("convnext", "gpu")
    assert size == "bench" and line is not None
    assert line.startswith("convnext: the zoo has no gpu size") and line.endswith(".")
    with pytest.raises(ValueError, match="no zoo size 'gpu' for 'convnext'"):
        _zoo.build("convnext", "gpu")
    with pytest.raises(ValueError, match="unknown zoo size"):
        _zoo.gpu_size("gpt2", "huge")
    # The gpu shapes reach each builder (small ones here, so that the host builds them).
    monkeypatch.setitem(_zoo.GPU_SIZED, "qwen2", (32, 3, 12, 3))
    monkeypatch.setitem(_zoo.GPU_SIZED, "shared", (32, 2, 12, 3))
    monkeypatch.setitem(_zoo.GPU_SIZED, "resnet", (8, 3, 10, 5))
    qwen2 = _zoo.build("qwen2", "gpu")
    assert len(qwen2.model.layers) == 3 and qwen2.inputs[0].shape == (3, 12)
    shared = _zoo.build("shared", "gpu")
    assert shared.model.depth == 2 and shared.inputs[0].shape == (3, 12)
    resnet = _zoo.build("resnet", "gpu")
    assert len(resnet.model.blocks) == 3 and resnet.inputs[0].shape == (5, 3, 10, 10)


def test_zoo_model_moves_its_inputs_and_the_targets_its_loss_holds() -> None:
    import _zoo

    for family in ("resnet", "qwen2"):
        case = _zoo.build(family, "small").to("meta")
        assert all(p.device.type == "meta" for p in case.model.parameters())
        assert all(t.device.type == "meta" for t in case.inputs)
        pending, seen = [case.loss_of], []
        while pending:
            for cell in pending.pop().__closure__ or ():
                value = cell.cell_contents
                if isinstance(value, torch.Tensor):
                    seen.append(value.device.type)
                elif callable(value) and getattr(value, "__closure__", None):
                    pending.append(value)
        assert seen and set(seen) == {"meta"}


def test_bench_budget_difference_is_relative_to_each_tensor() -> None:
    from _budget_measure import GPU_TOLERANCE, difference

    grads = [torch.tensor([1.0, -4.0]), torch.zeros(2)]
    reference = (torch.tensor(2.0), grads)
    assert difference((torch.tensor(2.0), [g.clone() for g in grads]), reference) == 0
    moved = (torch.tensor(2.0), [torch.tensor([1.0, -4.004]), torch.zeros(2)])
    assert difference(moved, reference) == pytest.approx(1e-3, rel=1e-3)
    assert GPU_TOLERANCE < 1e-3  # such a gap is not exact anywhere


def test_bench_budget_difference_floors_a_gradient_that_is_zero_but_for_rounding() -> None:
    from _budget_measure import GPU_TOLERANCE, difference

    # A key projection's bias: zero by the mathematics, 1e-11 by rounding, beside a
    # gradient near 1. Another run's rounding (twice as large) is no error.
    reference = (torch.tensor(2.0), [torch.tensor([1.0, -1.3]), torch.tensor([1e-11, 0.0])])
    noise = (torch.tensor(2.0), [torch.tensor([1.0, -1.3]), torch.tensor([-1e-11, 0.0])])
    assert difference(noise, reference) < GPU_TOLERANCE
    # Nor does the floor hide a real error in such a gradient.
    wrong = (torch.tensor(2.0), [torch.tensor([1.0, -1.3]), torch.tensor([0.01, 0.0])])
    assert difference(wrong, reference) > 1e-3


# torch 2.15 warns when saved-tensor hooks (the benchmark's activation meter) are active
# around torch's own selective checkpoint, which the benchmark's operator-rule rows run.
@pytest.mark.filterwarnings("ignore:A saved_tensors_hooks context:FutureWarning")
def test_bench_budget_runs_a_family_at_a_chosen_size_with_the_cpu_exactness_rule(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import argparse

    import bench_budget

    import accel

    args = argparse.Namespace(
        size="small",
        compile=False,
        warmup=0,
        steps=1,
        max_steps=1,
        within=0.04,
        rows="all",
        out_of_sample=None,
        fused_attention=False,
    )
    result = bench_budget.run_case("qwen2", accel.get_backend("cpu"), args)
    assert result["size"] == "small" and result["size_note"] is None
    # The built-in rates (in sample), and no mixed plan on the host: the grain is not offered.
    assert result["rates"] == {"source": "default", "out_of_sample": False}
    assert "not offered here" in result["unavailable"]["budget+offload 0.5"]
    assert result["mixed_against_recompute"] == {}
    assert result["exact_rule"] == "bit-equal" and result["plain_rerun_difference"] is None
    plain = result["variants"]["plain"]
    assert plain["bit_equal"] is True and plain["grad_difference"] == 0
    # On the CPU, exact is bit-equality, whatever the difference.
    for row in result["variants"].values():
        assert row["exact"] is row["bit_equal"]
    summary = result["summary_at_half"]
    assert summary is not None and {"estimate", "measured", "bit_equal"} <= set(summary)
    # One round (--max-steps 1), the noise beside each figure, both rules judged.
    assert result["noise"]["rounds"] == 1 and summary["noise"] == result["noise"]["noise"]
    assert set(result["dominance"]["rules"]) <= {"torch selective", "torchtitan op rule"}
