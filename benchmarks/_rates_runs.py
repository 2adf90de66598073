"""The CPU rates combined from ``bench_rates.py``'s runs, and the same with one left out.

``bench_rates.py`` calibrates once per zoo family (with the family's model, so that its
operators get byte rates of their own) and a few times without a model; the built-in
table is the median of those runs. That makes each family's estimate *in sample*: its
own run helped set the rates it is priced with. :func:`left_out` combines the same runs
without one family's, so ``bench_budget.py --out-of-sample RATES.json`` prices every
family with rates it did not help make (an operator only that family calls falls back
to the general byte rate), which is issue 40's out-of-sample check.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from checkpointing import DeviceRates
from checkpointing.planner import builtin_rates
from checkpointing.planner._tables import CPU_TABLES, HostProcessor

GENERAL = (
    "matmul_flops",
    "attention_flops",
    "convolution_flops",
    "memory_bytes",
    "random_bytes",
    "call_seconds",
    "policy_call_seconds",
    "policy_kept_seconds",
    "hook_seconds",
    "replay_seconds",
    "pack_bytes",
    "region_seconds",
    "saved_call_seconds",
    "region_tensor_seconds",
    "attention_score_seconds",
)
#: Rates timed together: a run without the second reads the first from the fallback too
#: (attention timed before its cost per score was split off has the softmax in its rate).
_PAIRED = {"attention_flops": "attention_score_seconds"}


def combine(
    runs: Mapping[str, Mapping[str, Any]], fallback: DeviceRates | None = None
) -> tuple[dict[str, float], dict[str, float]]:
    """Each general rate's median over ``runs``, and each operator's over the runs that
    time it.

    A run written before a field was added reads it from ``fallback`` where given,
    else as the field's default, as rate files do; a run without a paired field
    (:data:`_PAIRED`) reads its partner from ``fallback`` too.
    """
    default = DeviceRates.__dataclass_fields__

    def value(run: Mapping[str, Any], name: str) -> Any:
        paired = _PAIRED.get(name)
        if name in run and (paired is None or paired in run or fallback is None):
            return run[name]
        return getattr(fallback, name) if fallback is not None else default[name].default

    general = {
        name: statistics.median(value(run, name) for run in runs.values()) for name in GENERAL
    }
    by_operator: dict[str, list[float]] = {}
    for run in runs.values():
        for name, rate in run["operator_bytes"].items():
            by_operator.setdefault(name, []).append(rate)
    operators = {name: statistics.median(rates) for name, rates in sorted(by_operator.items())}
    return general, operators


def _built_in(values: Mapping[str, Any], device: str) -> DeviceRates:
    """The built-in table of the device a results file was measured on.

    For the CPU, the table of the processor its ``machine`` names; files written before
    the machine named its processor were all measured on the first table's host.
    """
    if device != "cpu":
        return builtin_rates(device)
    cpu = values.get("machine", {}).get("cpu")
    if not isinstance(cpu, dict):
        return CPU_TABLES[0].rates
    named = {field.name: cpu[field.name] for field in dataclasses.fields(HostProcessor)}
    return builtin_rates("cpu", HostProcessor(**named))


def left_out(path: str | Path, family: str) -> DeviceRates:
    """The rates of ``bench_rates.py``'s results file at ``path`` without ``family``'s run.

    A family the file has no run of (Mixtral, the diffusion UNet: calibrated without
    them) gets every run combined: those rates are out of sample for it as they stand,
    and their ``source`` says so.

    Raises:
        SystemExit: If the file is not such a results file.
    """
    values = json.loads(Path(path).read_text())
    runs = values.get("runs") if isinstance(values, dict) else None
    if values.get("benchmark") != "rates" or not isinstance(runs, dict):
        raise SystemExit(
            f"{path} is not a results file of benchmarks/bench_rates.py (no 'runs'); "
            "pass benchmarks/results/rates-<device>-<date>.json."
        )
    others = {name: run for name, run in runs.items() if name != family}
    # A checkpoint's and a saved-grain call's own costs are timed on small chains, not
    # on any family, so runs older than those fields read the built-in table's: out of
    # sample for every family, and priced as the in-sample rates price them: the table
    # of the host the file was measured on.
    device = str(values.get("backend", "cpu"))
    general, operators = combine(others, _built_in(values, device))
    without = "without" if family in runs else "which has no run of"
    return DeviceRates(
        device_type=device,
        source=f"{Path(path).name} {without} {family}",
        operator_bytes=operators,
        **general,
    )
