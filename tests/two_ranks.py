"""Two ranks of a gloo group, run as subprocesses of a test: the suite's one launcher.

:func:`run_two_ranks` writes a worker script, starts it twice (``RANK`` 0 and 1,
``WORLD_SIZE=2``, ``MASTER_ADDR=127.0.0.1`` and a free port, one intra-op thread), and
returns what each rank printed on its last line starting with ``TAG `` (JSON). It
retries once (the free port can be taken between the probe and the rendezvous) and
fails the test with both attempts' output otherwise, within one deadline.

A worker prints its line after a last barrier and leaves with ``os._exit(0)``, without
``destroy_process_group``: torch.distributed's teardown can hang once the rank that hosts
the store has left (pytorch/pytorch#75097; a torch 2.4.1 rank did so in CI).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _attempt(
    script: Path, deadline: float, env: dict[str, str], tag: str
) -> tuple[list[Any] | None, str]:
    """Run both ranks once; return their results, or None and what went wrong."""
    port = _free_port()
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    processes = [
        subprocess.Popen(
            [sys.executable, str(script)],
            env={
                **os.environ,
                "RANK": str(rank),
                "WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "PYTHONPATH": pythonpath,
                "OMP_NUM_THREADS": "1",
                "REPO": str(REPO),
                **env,
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    results: list[Any] = []
    problems: list[str] = []
    try:
        for rank, process in enumerate(processes):
            try:
                out, err = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                problems.append(f"rank {rank} did not finish before the deadline")
                continue
            lines = [line for line in out.splitlines() if line.startswith(f"{tag} ")]
            if process.returncode != 0 or not lines:
                problems.append(
                    f"rank {rank} exited with {process.returncode}:\n{out}\n{err[-3000:]}"
                )
                continue
            results.append(json.loads(lines[-1][len(tag) + 1 :]))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.communicate()  # closes its pipes: none is left for the collector
    return (None if problems else results), "\n".join(problems)


def run_two_ranks(
    worker: str,
    folder: Path,
    timeout_s: float,
    env: dict[str, str] | None = None,
    tag: str = "RESULTS",
) -> list[Any]:
    """Run ``worker`` (a script's text) as two ranks; each rank's ``TAG`` JSON, in order."""
    script = folder / "worker.py"
    script.write_text(worker)
    problems = []
    deadline = time.monotonic() + timeout_s
    for _ in range(2):
        if time.monotonic() >= deadline:
            break
        results, problem = _attempt(script, deadline, env or {}, tag)
        if results is not None:
            return results
        problems.append(problem)
    pytest.fail("the two ranks failed twice:\n" + "\n---\n".join(problems))
