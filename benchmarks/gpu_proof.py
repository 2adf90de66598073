"""One-command proof on a CUDA machine: install, benchmark, certify and test accel.

Run it as ``bash benchmarks/gpu_proof.sh`` from a checkout, on a machine with one CUDA GPU,
torch and pytest installed, and no network. Steps, each with a time limit (its budget,
printed as granted), within ``--budget-s`` (540 s) in all:

1. ``environment``: Python, torch and the GPU, as the installed torch sees them;
2. ``install``: a venv layered on this environment, then accel installed with no index
   (a built wheel from ``--wheels``, else ``pip install --no-deps --no-build-isolation
   --no-index -e .``; see ``_proof_install.py``);
3. ``plugins``: ``python -m accel --json`` lists ``cuda``;
4. ``fairscale``: fairscale 0.4.13 (and numpy where missing) from ``--wheels``;
   ``deepspeed``: DeepSpeed and its requirements from ``--wheels`` where a DeepSpeed
   wheel is there (optional: without it bench_offload records DeepSpeed as not
   installed, and nothing fails);
5. ``bench-offload`` first among the GPU steps (the main result: nothing before it can
   eat its time; ours against the copy floor, FSDP2 with CPU offload, fairscale and
   DeepSpeed ZeRO-3 on the same model and cap), then ``bench-checkpoint`` on a GPU-sized
   model;
6. ``bench-budget``: ``bench_budget.py --size gpu`` on a subset of the zoo's families
   (``BUDGET_FAMILIES``): the planner's estimated step-time ratio beside the measured
   one at budgets 0.75, 0.5 and 0.25, and torch's checkpointing beside it;
7. ``conformance`` (``python -m accel conformance cuda``, time for cold triton compiles)
   and ``cuda-tests`` (``pytest tests --accel=cuda -k cuda``).

``--part offload`` (bench-offload alone), ``--part bench``, ``--part budget``
(bench-budget alone) or ``--part tests`` runs the setup steps and a part, for a machine
whose commands stop at 10 minutes. Every step runs with ``PYTHONPATH`` at the repository
root, its JSON is read from its stdout alone, and a step's failure never stops the next.
The summary reads the JSON each benchmark wrote and prints each target met, MISSED or NOT
PROVEN (bench-budget's: per family at budget 0.5, the time target with the estimated and
measured ratios, the budget +2% and exactness); the proof fails on either of the last
two (``--without-fairscale`` declares the fairscale comparison expected to be absent).
``--dry-run`` runs every step on CPU, the CUDA ones reporting "skipped: no GPU" (with
the command each would run) but bench-offload, which runs its smoke run (a tiny model on
the host; its JSON must hold every summary key), and lists the wheels to bring and each
budget.
Results: ``benchmarks/results/gpu-proof-<cuda|dry-run>-<part>-<date>.json``.
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
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import _proof_install as provision
from _proof_targets import print_verdicts, verdicts

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "benchmarks" / "results"
TAIL_LINES = 40

#: Each step's time limit in seconds. A step is granted its limit or what is left of the
#: budget, whichever is less; bench-offload runs first among the GPU steps.
LIMITS = {
    "environment": 60,
    "install": 120,
    "plugins": 60,
    "fairscale": 60,
    "deepspeed": 90,
    # Ours, FSDP2, fairscale (twice: out of memory under 3 GiB) and DeepSpeed where
    # installed (its child process stops at 150 s), each with the host optimizer: the
    # first run, without FSDP2, DeepSpeed or the optimizer, took 117 s.
    "bench-offload": 420,
    "bench-checkpoint": 120,
    # Seven GPU-sized families, eight variants each, three timed rounds; the JSON is
    # written after every family, so a step cut short keeps the families it finished.
    "bench-budget": 450,
    "conformance": 240,  # a cold triton compile per compiled test
    "cuda-tests": 240,
}
SETUP = ("environment", "install", "plugins", "fairscale", "deepspeed")
PARTS = {
    "offload": ("bench-offload",),
    "bench": ("bench-offload", "bench-checkpoint"),
    "budget": ("bench-budget",),
    "tests": ("conformance", "cuda-tests"),
}
PARTS["all"] = PARTS["bench"] + PARTS["budget"] + PARTS["tests"]


def step_names(part: str) -> list[str]:
    """The steps ``--part part`` runs: fairscale and deepspeed only for bench-offload."""
    offload = "bench-offload" in PARTS[part]
    setup = [name for name in SETUP if offload or name not in ("fairscale", "deepspeed")]
    return [*setup, *PARTS[part]]


#: The zoo families bench-budget runs at their gpu size (``_zoo.GPU_SIZED``), and its
#: timed rounds.
BUDGET_FAMILIES = ("gpt2", "llama", "qwen2", "vit", "resnet", "shared", "bert")
BUDGET_STEPS = 3

#: bench_checkpoint's default model is launch-bound on an H100: the proof passes this one.
CHECKPOINT_GPU_CONFIG = (
    "--layers", "8", "--d-model", "1024", "--heads", "16", "--ffn", "4096",
    "--seq", "1024", "--batch", "16", "--warmup", "3", "--steps", "20",
)  # fmt: skip

_ENVIRONMENT_SCRIPT = """
import json, platform, sys
import torch
info = {"python": platform.python_version(), "platform": platform.platform(),
        "executable": sys.executable, "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_devices": torch.cuda.device_count() if torch.version.cuda else 0}
if info["cuda_devices"]:
    info["gpu"] = torch.cuda.get_device_name(0)
print(json.dumps(info))
"""

_FAIRSCALE_CHECK = (
    "import json, fairscale; from fairscale.experimental.nn.offload import OffloadModel; "
    "print(json.dumps({'fairscale': fairscale.__version__}))"
)


@dataclass
class Step:
    """One step's outcome, as written to the JSON file."""

    name: str
    status: str = "pending"  # passed, failed, skipped
    reason: str = ""
    limit_s: float = 0.0
    command: list[str] = field(default_factory=list)
    seconds: float = 0.0
    returncode: int | None = None
    command_count: int = 0
    output_tail: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)


@dataclass
class Done:
    """A finished command: its exit status and its stdout alone."""

    returncode: int
    stdout: str


def last_json(stdout: str) -> dict[str, Any]:
    """The JSON object on ``stdout`` (warnings go to stderr, which is never parsed).

    Either the whole output from its first ``{`` (a pretty-printed document, as
    ``python -m accel --json`` writes), or the last line that is a JSON object.
    """
    candidates = [stdout[stdout.index("{") :]] if "{" in stdout else []
    candidates += [line for line in reversed(stdout.splitlines()) if line.startswith("{")]
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    raise ValueError(f"no JSON object on stdout: {stdout[-300:]!r}")


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
        self.fairscale = False
        self.env = dict(os.environ)
        # Every step imports accel, the benchmarks and the tests from the working tree's
        # root, installed or not (`python benchmarks/x.py` puts only benchmarks/ first).
        self.env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(REPO), os.environ.get("PYTHONPATH")])
        )
        self.env["PYTHONUNBUFFERED"] = "1"

    def remaining(self) -> float:
        return self.args.budget_s - (time.monotonic() - self.start)

    def run(self, step: Step, command: list[str]) -> Done | None:
        """Run ``command`` from the repository root within the step's granted limit."""
        step.command = command
        # A step of several commands shares its limit between them.
        limit = min(LIMITS[step.name] - step.seconds, self.remaining() - 5)
        if not step.command_count:
            step.limit_s = max(0, round(limit))
            print(f"    granted {limit:.0f} s (limit {LIMITS[step.name]} s)", flush=True)
        step.command_count += 1
        if limit <= 0:  # a failure: what this step proves is missing
            step.status, step.reason = "failed", "out of time: the budget is spent"
            return None
        out_path, err_path = self.workdir / f"{step.name}.out", self.workdir / f"{step.name}.err"
        began = time.monotonic()
        with out_path.open("w") as out, err_path.open("w") as err:
            process = subprocess.Popen(
                command, cwd=REPO, stdout=out, stderr=err, env=self.env, start_new_session=True
            )
            try:
                returncode: int | None = process.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                returncode = None
        step.seconds = round(step.seconds + time.monotonic() - began, 1)
        stdout = out_path.read_text(encoding="utf-8", errors="replace")
        stderr = err_path.read_text(encoding="utf-8", errors="replace")
        step.output_tail = (stdout.splitlines() + stderr.splitlines())[-TAIL_LINES:]
        step.returncode = returncode
        if returncode is None:
            step.status, step.reason = "failed", f"timed out after {limit:.0f} s"
            return None
        step.status = "passed" if returncode == 0 else "failed"
        step.reason = "" if returncode == 0 else f"exit status {returncode}"
        return Done(returncode, stdout)

    def step(self, name: str, body: Callable[[Step], None]) -> Step:
        """Run one step's ``body``; an exception in it fails that step alone."""
        step = Step(name)
        self.steps.append(step)
        print(f"=== {name}", flush=True)
        try:
            body(step)
        except Exception as exc:
            step.status = "failed"
            step.reason = f"{type(exc).__name__}: {exc}"
            step.output_tail += traceback.format_exc().splitlines()[-10:]
        if step.status == "pending":
            step.status = "passed"
        detail = f" ({step.reason})" if step.reason else ""
        print(f"    {step.status}{detail} in {step.seconds} s", flush=True)
        if step.status == "failed":
            for line in step.output_tail[-15:]:
                print(f"    | {line}")
        return step


def step_environment(runner: Runner, step: Step) -> None:
    done = runner.run(step, [runner.python, "-c", _ENVIRONMENT_SCRIPT])
    if done is not None and done.returncode == 0:
        runner.environment = last_json(done.stdout)
        devices = int(runner.environment.get("cuda_devices", 0))
        runner.has_gpu = devices > 0 and not runner.args.dry_run
        step.reason = f"{devices} CUDA device(s)" + (", dry run" if runner.args.dry_run else "")


def step_install(runner: Runner, step: Step) -> None:
    venv = runner.workdir / "venv"
    made = runner.run(step, [runner.python, "-m", "venv", "--without-pip", str(venv)])
    if made is None or made.returncode != 0:
        return
    python = str(provision.layer_on_current(venv))
    commands, advice = provision.install_commands(python, Path(runner.args.wheels))
    for command in commands:
        done = runner.run(step, command)
        if done is not None and done.returncode == 0:
            runner.python = python
            step.reason = f"with no index: {' '.join(command[3:])}"
            return
    step.status = "failed"
    step.reason = f"{advice} The steps below run from the working tree (PYTHONPATH)."


def step_plugins(runner: Runner, step: Step) -> None:
    done = runner.run(step, [runner.python, "-m", "accel", "--json"])
    if done is None or done.returncode != 0:
        return
    rows = {row["name"]: row for row in last_json(done.stdout)["backends"]}
    if "cuda" not in rows:
        step.status, step.reason = "failed", "python -m accel does not list cuda"
        return
    cuda = rows["cuda"]
    step.reason = "cuda " + ("available" if cuda["available"] else f"unavailable: {cuda['reason']}")


def step_fairscale(runner: Runner, step: Step) -> None:
    wheels = Path(runner.args.wheels)
    step.limit_s = LIMITS[step.name]
    if runner.args.without_fairscale:
        step.status, step.reason = "skipped", "--without-fairscale: no comparison expected"
        return
    chosen, missing = provision.fairscale_wheels(wheels)
    if missing:
        step.status = "skipped"
        step.reason = (
            f"missing from {wheels}/: {', '.join(missing)}; the fairscale comparison will "
            "be NOT PROVEN (bring them, or pass --without-fairscale)"
        )
        return
    pip = [runner.python, "-m", "pip", "install", "--no-deps", "--no-index"]
    done = runner.run(step, [*pip, "--find-links", str(wheels), *map(str, chosen)])
    if done is None or done.returncode != 0:
        return
    done = runner.run(step, [runner.python, "-c", _FAIRSCALE_CHECK])
    if done is not None and done.returncode == 0:
        runner.fairscale = True
        step.reason = f"fairscale {last_json(done.stdout)['fairscale']} from {chosen[0].name}"


def step_deepspeed(runner: Runner, step: Step) -> None:
    wheels = Path(runner.args.wheels)
    step.limit_s = LIMITS[step.name]
    found = sorted(wheels.glob("deepspeed-*.whl")) if wheels.is_dir() else []
    if not found:
        step.status = "skipped"
        step.reason = (
            f"no deepspeed wheel in {wheels}/: bench-offload records DeepSpeed as not "
            "installed (optional)"
        )
        return
    pip = [runner.python, "-m", "pip", "install", "--no-index", "--find-links", str(wheels)]
    done = runner.run(step, [*pip, str(found[-1])])
    if done is not None and done.returncode == 0:
        step.reason = f"{found[-1].name} and its requirements from {wheels}/"
    elif done is not None:
        # Optional: bench-offload records the import's failure as DeepSpeed's result.
        step.status = "skipped"
        step.reason = f"pip could not install {found[-1].name} with no index (optional)"


#: What a dry run runs on CPU in a GPU step's place: the same script's smoke run, whose
#: JSON (in the run's temporary folder) must carry every summary key.
DRY_RUN_STEPS: dict[str, list[str]] = {
    "bench-offload": [
        "{python}", "benchmarks/bench_offload.py", "--smoke", "--results-dir", "{workdir}",
    ],
}  # fmt: skip
SUMMARY_KEYS = (
    "step_over_floor", "overlap_efficiency", "allocator_retries", "backward_allocations",
    "backward_allocations_on_device", "fsdp2_step_ratio", "fairscale_speedup", "device",
)  # fmt: skip


def smoke_step(runner: Runner, step: Step) -> None:
    """A GPU step's smoke run on CPU (dry run): the script runs and its summary is whole."""
    command = DRY_RUN_STEPS[step.name]
    fill = {"{python}": runner.python, "{workdir}": str(runner.workdir)}
    done = runner.run(step, [fill.get(c, c) for c in command])
    if done is None or done.returncode != 0:
        return
    written = sorted(runner.workdir.glob("offload-smoke-*.json"))
    summary = json.loads(written[-1].read_text()).get("summary", {}) if written else {}
    missing = [key for key in SUMMARY_KEYS if key not in summary]
    if missing:
        step.status = "failed"
        step.reason = f"the smoke run's JSON lacks the summary keys {', '.join(missing)}"
        return
    step.reason = "dry run: the smoke run on the host wrote every summary key"


def gpu_step(command: list[str]) -> Callable[[Runner, Step], None]:
    def body(runner: Runner, step: Step) -> None:
        if not runner.has_gpu and runner.args.dry_run and step.name in DRY_RUN_STEPS:
            smoke_step(runner, step)
            return
        if not runner.has_gpu:
            step.command = command
            step.limit_s = min(LIMITS[step.name], max(0, round(runner.remaining() - 5)))
            step.status = "skipped"
            step.reason = "no GPU" + (" (dry run)" if runner.args.dry_run else "")
            return
        before = {path: path.stat().st_mtime for path in RESULTS_DIR.glob("*.json")}
        runner.run(step, [runner.python if c == "{python}" else c for c in command])
        step.files = sorted(
            str(path.relative_to(REPO))
            for path in RESULTS_DIR.glob("*.json")
            if before.get(path) != path.stat().st_mtime and not path.name.startswith("gpu-proof")
        )

    return body


GPU_STEPS: dict[str, list[str]] = {
    # No peer starts after 300 s of the step's 420: the figures taken are always written.
    "bench-offload": [
        "{python}", "benchmarks/bench_offload.py", "--backend", "cuda", "--deadline-s", "300",
    ],
    "bench-checkpoint": [
        "{python}", "benchmarks/bench_checkpoint.py", "--backend", "cuda",
        *CHECKPOINT_GPU_CONFIG,
    ],
    "bench-budget": [
        "{python}", "benchmarks/bench_budget.py", "--backend", "cuda", "--size", "gpu",
        "--model", ",".join(BUDGET_FAMILIES), "--steps", str(BUDGET_STEPS),
    ],
    "conformance": [
        "{python}", "-m", "accel", "conformance", "cuda", "-q", "-p", "no:cacheprovider",
    ],
    "cuda-tests": [
        "{python}", "-m", "pytest", "tests", "--accel=cuda", "-k", "cuda", "-q",
        "-p", "no:cacheprovider",
    ],
}  # fmt: skip


def print_plan(args: argparse.Namespace) -> None:
    """What this run needs and allows: the wheels to bring and each step's limit."""
    for line in provision.bring_advice(Path(args.wheels)):
        print(line)
    names = step_names(args.part)
    total = sum(LIMITS[name] for name in names)
    print(f"\nstep limits for --part {args.part} (budget {args.budget_s:.0f} s):")
    for name in names:
        print(f"  {name.ljust(16)} {LIMITS[name]:4d} s")
    if total > args.budget_s:
        advice = (
            "; on a machine whose commands stop at 10 minutes run --part bench, --part "
            "budget and --part tests as separate commands"
            if args.part == "all"
            else ""
        )
        print(
            f"  the limits add up to {total} s, over the budget: later steps get what is "
            f"left{advice}"
        )
    print()


def write_summary(runner: Runner, found: list[Any]) -> Path:
    now = dt.datetime.now(dt.timezone.utc)
    tag = "dry-run" if runner.args.dry_run else "cuda"
    document = {
        "benchmark": "gpu-proof",
        "mode": tag,
        "part": runner.args.part,
        "date": now.isoformat(),
        "budget_s": runner.args.budget_s,
        "total_s": round(time.monotonic() - runner.start, 1),
        "machine": runner.environment,
        "steps": [asdict(step) for step in runner.steps],
        "targets": [asdict(verdict) for verdict in found],
    }
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"gpu-proof-{tag}-{runner.args.part}-{now:%Y%m%d}.json"
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="on CPU: CUDA steps are skipped")
    parser.add_argument("--wheels", default=str(REPO / ".whl"), help="directory of wheels")
    parser.add_argument("--budget-s", type=float, default=540.0, help="time for all steps")
    parser.add_argument("--part", choices=sorted(PARTS), default="all", help="steps to run")
    parser.add_argument(
        "--without-fairscale",
        action="store_true",
        help="no fairscale comparison is expected: its absence is not a failure",
    )
    parser.add_argument("--keep-venv", action="store_true", help="keep the virtual environment")
    parser.add_argument(
        "--copy-results",
        metavar="DIR",
        default=None,
        help="also copy the JSON files written into DIR (a lent machine returns only its "
        'output folder, e.g. --copy-results "$OUT")',
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print_plan(args)
    runner = Runner(args)
    bodies: dict[str, Callable[[Runner, Step], None]] = {
        "environment": step_environment,
        "install": step_install,
        "plugins": step_plugins,
        "fairscale": step_fairscale,
        "deepspeed": step_deepspeed,
        **{name: gpu_step(command) for name, command in GPU_STEPS.items()},
    }
    try:
        for name in step_names(args.part):
            runner.step(name, lambda step, body=bodies[name]: body(runner, step))
    finally:
        files = [REPO / name for step in runner.steps for name in step.files]
        found = verdicts(files, without_fairscale=args.without_fairscale)
        path = write_summary(runner, found)
        if args.copy_results:
            Path(args.copy_results).mkdir(parents=True, exist_ok=True)
            for written in [*files, path]:
                if written.is_file():
                    shutil.copy2(written, Path(args.copy_results) / written.name)
        if args.keep_venv:
            print(f"virtual environment kept in {runner.workdir / 'venv'}")
        else:
            shutil.rmtree(runner.workdir, ignore_errors=True)
    return report(runner, found, path)


def report(runner: Runner, found: list[Any], path: Path) -> int:
    args = runner.args
    print()
    width = max(len(step.name) for step in runner.steps)
    print(f"{'step'.ljust(width)}  status   granted  seconds  detail")
    for step in runner.steps:
        print(
            f"{step.name.ljust(width)}  {step.status.ljust(7)}  {step.limit_s:5.0f} s"
            f"  {step.seconds:7.1f}  {step.reason}"
        )
    print()
    print_verdicts(found)
    print(f"\nwrote {path.relative_to(REPO)} ({time.monotonic() - runner.start:.0f} s in all)")
    failed = [step.name for step in runner.steps if step.status == "failed"]
    missed = [f"{v.benchmark}.{v.target}: {v.verdict}" for v in found if v.fails]
    if failed or missed:
        print(f"FAILED: {', '.join(failed + missed)}")
        return 1
    if not runner.has_gpu and not args.dry_run:
        print("No CUDA GPU is visible, so nothing was proven; use --dry-run to check the script.")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
