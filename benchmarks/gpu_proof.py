"""One-command proof on a CUDA machine: install, certify, test and benchmark accel.

Run it as ``bash benchmarks/gpu_proof.sh`` from a checkout, on a machine with one CUDA GPU,
torch and pytest installed, and no network. In order, with a time limit per step and
9 minutes in all:

1. ``environment``: Python, torch and the GPU, as the installed torch sees them;
2. ``install``: a virtual environment on top of the system packages (so the system is
   left alone), then ``pip install --no-deps -e .`` from the working tree;
3. ``plugins``: ``python -m accel --json`` lists ``cuda``;
4. ``fairscale``: installs fairscale 0.4.13 from ``--wheels`` (default ``.whl/``) for the
   side-by-side comparison, or says how to bring it;
5. ``conformance``: ``python -m accel conformance cuda``;
6. ``cuda-tests``: every test that runs on CUDA (``pytest tests --accel=cuda -k cuda``:
   the accel_backend tests on cuda and tests/offload/test_offload_cuda.py);
7. ``bench-checkpoint`` and 8. ``bench-offload`` on cuda (the latter against fairscale's
   OffloadModel when step 4 installed it).

Every step's outcome, duration, command and output tail go to
``benchmarks/results/gpu-proof-<cuda|dry-run>-<date>.json`` beside the benchmarks' own
JSON files, and a summary table is printed. ``--dry-run`` runs every step on CPU, the
CUDA ones reporting "skipped: no GPU"; the exit status is 0 when no step failed (and,
without ``--dry-run``, when the GPU steps ran).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "benchmarks" / "results"
FAIRSCALE = "fairscale==0.4.13"
TAIL_LINES = 40

_ENVIRONMENT_SCRIPT = """
import json, platform, sys
import torch
info = {"python": platform.python_version(), "platform": platform.platform(),
        "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "cuda_devices": torch.cuda.device_count() if torch.version.cuda else 0}
if info["cuda_devices"]:
    info["gpu"] = torch.cuda.get_device_name(0)
print(json.dumps(info))
"""

_FAIRSCALE_CHECK = (
    "import fairscale; from fairscale.experimental.nn.offload import OffloadModel; "
    "print(fairscale.__version__)"
)


@dataclass
class Step:
    """One step's outcome, as written to the JSON file."""

    name: str
    status: str = "pending"  # passed, failed, skipped
    reason: str = ""
    command: list[str] = field(default_factory=list)
    seconds: float = 0.0
    returncode: int | None = None
    output_tail: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)


class Runner:
    """Runs the steps in order within one time budget and collects their outcomes."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.start = time.monotonic()
        self.steps: list[Step] = []
        self.workdir = Path(tempfile.mkdtemp(prefix="accel-gpu-proof-"))
        self.python = sys.executable
        self.environment: dict[str, Any] = {}
        self.has_gpu = False

    def remaining(self) -> float:
        return self.args.budget_s - (time.monotonic() - self.start)

    def run(
        self, step: Step, command: list[str], limit_s: float
    ) -> subprocess.CompletedProcess[str] | None:
        """Run ``command`` from the repository root within ``limit_s`` (and the budget)."""
        step.command = command
        limit = min(limit_s, self.remaining() - 5)
        if limit <= 0:
            step.status, step.reason = "skipped", "out of time: the 9-minute budget is spent"
            return None
        log = self.workdir / f"{step.name}.log"
        began = time.monotonic()
        with log.open("w", encoding="utf-8") as out:
            process = subprocess.Popen(
                command,
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            try:
                returncode = process.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                returncode = None
        step.seconds = round(time.monotonic() - began, 1)
        text = log.read_text(encoding="utf-8", errors="replace")
        step.output_tail = text.splitlines()[-TAIL_LINES:]
        step.returncode = returncode
        if returncode is None:
            step.status, step.reason = "failed", f"timed out after {limit:.0f} s"
            return None
        step.status = "passed" if returncode == 0 else "failed"
        if returncode != 0:
            step.reason = f"exit status {returncode}"
        return subprocess.CompletedProcess(command, returncode, text, "")

    def add(self, name: str) -> Step:
        step = Step(name)
        self.steps.append(step)
        print(f"=== {name}", flush=True)
        return step

    def report(self, step: Step) -> None:
        detail = f" ({step.reason})" if step.reason else ""
        print(f"    {step.status}{detail} in {step.seconds} s", flush=True)
        if step.status == "failed":
            for line in step.output_tail[-15:]:
                print(f"    | {line}")


def step_environment(runner: Runner) -> None:
    step = runner.add("environment")
    done = runner.run(step, [runner.python, "-c", _ENVIRONMENT_SCRIPT], 60)
    if done is not None and done.returncode == 0:
        runner.environment = json.loads(done.stdout.strip().splitlines()[-1])
        devices = int(runner.environment.get("cuda_devices", 0))
        runner.has_gpu = devices > 0 and not runner.args.dry_run
        step.reason = f"{devices} CUDA device(s)" + (", dry run" if runner.args.dry_run else "")
    runner.report(step)


def step_install(runner: Runner) -> None:
    step = runner.add("install")
    venv = runner.workdir / "venv"
    # Without pip of its own: the system's pip (a system site package) installs into it.
    made = runner.run(
        step,
        [runner.python, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
        60,
    )
    if made is None or made.returncode != 0:
        runner.report(step)
        return
    python = str(venv / ("Scripts" if os.name == "nt" else "bin") / "python")
    attempts = [
        # Builds with the setuptools already installed: no network needed.
        [python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-e", "."],
        # Else an isolated build whose setuptools and wheel come from the wheel directory.
        [
            python,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--find-links",
            str(runner.args.wheels),
            "-e",
            ".",
        ],
    ]
    for command in attempts:
        done = runner.run(step, command, 120)
        if done is not None and done.returncode == 0:
            runner.python = python
            runner.report(step)
            return
    step.reason = (
        "pip install --no-deps -e . failed; the steps below run from the working tree. "
        "Install setuptools and wheel, or put their wheels in the wheel directory "
        "(pip download setuptools wheel -d .whl/)"
    )
    runner.report(step)


def step_plugins(runner: Runner) -> None:
    step = runner.add("plugins")
    done = runner.run(step, [runner.python, "-m", "accel", "--json"], 60)
    if done is not None and done.returncode == 0:
        report = json.loads(done.stdout[done.stdout.index("{") :])
        rows = {row["name"]: row for row in report["backends"]}
        if "cuda" not in rows:
            step.status, step.reason = "failed", "python -m accel does not list cuda"
        else:
            cuda = rows["cuda"]
            step.reason = "cuda " + (
                "available" if cuda["available"] else f"unavailable: {cuda['reason']}"
            )
    runner.report(step)


def step_fairscale(runner: Runner) -> None:
    step = runner.add("fairscale")
    wheels = Path(runner.args.wheels)
    found = sorted(wheels.glob("fairscale-0.4.13*")) if wheels.is_dir() else []
    if not found:
        step.status = "skipped"
        step.reason = (
            f"no {FAIRSCALE} wheel or sdist in {wheels}/, so bench-offload runs without "
            f"fairscale. On a machine with network: pip download --no-deps {FAIRSCALE} "
            f"-d {wheels}/ and bring that directory along"
        )
        runner.report(step)
        return
    command = [
        runner.python,
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "--find-links",
        str(wheels),
        str(found[0]),
    ]
    done = runner.run(step, command, 120)
    if done is not None and done.returncode == 0:
        done = runner.run(step, [runner.python, "-c", _FAIRSCALE_CHECK], 60)
        if done is not None and done.returncode == 0:
            step.reason = f"fairscale {done.stdout.strip().splitlines()[-1]} from {found[0].name}"
    runner.report(step)


def cuda_step(runner: Runner, name: str, command: list[str], limit_s: float) -> None:
    step = runner.add(name)
    if not runner.has_gpu:
        step.command = command
        step.status = "skipped"
        step.reason = "no GPU" + (" (dry run)" if runner.args.dry_run else "")
        runner.report(step)
        return
    before = {path: path.stat().st_mtime for path in RESULTS_DIR.glob("*.json")}
    runner.run(step, command, limit_s)
    step.files = sorted(
        str(path.relative_to(REPO))
        for path in RESULTS_DIR.glob("*.json")
        if before.get(path) != path.stat().st_mtime
    )
    runner.report(step)


def write_summary(runner: Runner) -> Path:
    now = dt.datetime.now(dt.timezone.utc)
    tag = "dry-run" if runner.args.dry_run else "cuda"
    document = {
        "benchmark": "gpu-proof",
        "mode": tag,
        "date": now.isoformat(),
        "budget_s": runner.args.budget_s,
        "total_s": round(time.monotonic() - runner.start, 1),
        "machine": runner.environment,
        "steps": [asdict(step) for step in runner.steps],
    }
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"gpu-proof-{tag}-{now:%Y%m%d}.json"
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="on CPU: CUDA steps are skipped")
    parser.add_argument(
        "--wheels", default=str(REPO / ".whl"), help="directory with the fairscale wheel"
    )
    parser.add_argument("--budget-s", type=float, default=540.0, help="time for all steps")
    parser.add_argument("--keep-venv", action="store_true", help="keep the virtual environment")
    args = parser.parse_args()

    runner = Runner(args)
    try:
        step_environment(runner)
        step_install(runner)
        step_plugins(runner)
        step_fairscale(runner)
        python = runner.python
        cuda_step(
            runner,
            "conformance",
            [python, "-m", "accel", "conformance", "cuda", "-q", "-p", "no:cacheprovider"],
            90,
        )
        cuda_step(
            runner,
            "cuda-tests",
            [
                python,
                "-m",
                "pytest",
                "tests",
                "--accel=cuda",
                "-k",
                "cuda",
                "-q",
                "-p",
                "no:cacheprovider",
            ],
            180,
        )
        cuda_step(
            runner,
            "bench-checkpoint",
            [python, "benchmarks/bench_checkpoint.py", "--backend", "cuda"],
            90,
        )
        cuda_step(
            runner,
            "bench-offload",
            [python, "benchmarks/bench_offload.py", "--backend", "cuda"],
            180,
        )
    finally:
        path = write_summary(runner)
        if args.keep_venv:
            print(f"virtual environment kept in {runner.workdir / 'venv'}")
        else:
            shutil.rmtree(runner.workdir, ignore_errors=True)

    print()
    width = max(len(step.name) for step in runner.steps)
    print(f"{'step'.ljust(width)}  status   seconds  detail")
    for step in runner.steps:
        print(
            f"{step.name.ljust(width)}  {step.status.ljust(7)}  {step.seconds:7.1f}  {step.reason}"
        )
    print(f"\nwrote {path.relative_to(REPO)} ({time.monotonic() - runner.start:.0f} s in all)")
    failed = [step.name for step in runner.steps if step.status == "failed"]
    no_gpu = [s.name for s in runner.steps if s.reason.startswith("no GPU") and not args.dry_run]
    if failed:
        print(f"FAILED: {', '.join(failed)}")
        return 1
    if no_gpu:
        print("No CUDA GPU is visible, so nothing was proven; use --dry-run to check the script.")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
