#!/usr/bin/env bash
# One-command proof on a machine with one CUDA GPU and no network:
#   bash benchmarks/gpu_proof.sh [--part all|offload|bench|budget|tests] [--wheels DIR] [--budget-s 540]
#                                [--without-fairscale] [--keep-venv] [--copy-results DIR]
#   bash benchmarks/gpu_proof.sh --dry-run   # wheels to bring, each step's limit, CPU steps
# Installs accel with no index into a throwaway venv layered on this environment (a built
# accel_hal wheel from --wheels, default .whl/, else --no-build-isolation -e .), runs
# bench_offload.py first (ours, then fairscale 0.4.13 from --wheels), bench_checkpoint.py on
# a GPU-sized model, bench_budget.py at the zoo's gpu size (the planner's estimate against
# the measured step time), the CUDA conformance suite and every CUDA test, then checks each
# benchmark target in the JSON written (met / MISSED / NOT PROVEN). See gpu_proof.py.
set -euo pipefail
cd "$(dirname "$0")/.."
# python3 first: on the lent GPU image it is the Python that holds torch.
PYTHON="${PYTHON:-python3}"
command -v "$PYTHON" >/dev/null || PYTHON=python
exec "$PYTHON" benchmarks/gpu_proof.py "$@"
