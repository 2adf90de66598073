#!/usr/bin/env bash
# One-command proof on a machine with one CUDA GPU (no network needed):
#   bash benchmarks/gpu_proof.sh [--wheels DIR] [--budget-s 540] [--keep-venv]
#   bash benchmarks/gpu_proof.sh --dry-run      # every step on CPU, CUDA steps skipped
# Installs accel (pip install --no-deps -e .) into a throwaway virtual environment on top
# of the system's packages, runs the CUDA conformance suite, every CUDA test,
# bench_checkpoint.py and bench_offload.py on cuda, and fairscale 0.4.13's OffloadModel
# side by side (its wheel taken from --wheels, default .whl/). Results: JSON under
# benchmarks/results/ and a summary table. Steps and limits: benchmarks/gpu_proof.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
command -v "$PYTHON" >/dev/null || PYTHON=python3
exec "$PYTHON" benchmarks/gpu_proof.py "$@"
