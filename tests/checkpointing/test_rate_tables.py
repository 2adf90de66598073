"""The built-in CPU tables: one per processor they were measured on (issue 40).

A host takes the table measured on its processor, read from ``/proc/cpuinfo`` and never
timed, so every process on the host plans alike; a host whose processor no table was
measured on takes the first table, and the plan's note says so and how to measure the
host's own rates.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

import accel
from checkpointing import plan_checkpointing
from checkpointing.planner import _tables, builtin_rates
from checkpointing.planner._default_rates import host_rates
from checkpointing.planner._tables import CPU_TABLES, HostProcessor, cpu_table_note, processor_of

_XEON_INFO = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 85
model name\t: Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz
flags\t\t: fpu vme

processor\t: 1
vendor_id\t: GenuineIntel
"""

_ZEN5_INFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC
"""

_ZEN4_INFO = _ZEN5_INFO.replace(": 26", ": 25").replace(": 2\n", ": 17\n")

# An arm64 host's cpuinfo: no vendor_id, no family, no model name.
_ARM_INFO = """
processor\t: 0
BogoMIPS\t: 243.75
CPU implementer\t: 0x41
CPU part\t: 0xd0c
"""


@pytest.fixture(autouse=True)
def _no_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path))


def _host(monkeypatch: pytest.MonkeyPatch, cpuinfo: str) -> HostProcessor:
    processor = processor_of(cpuinfo)
    monkeypatch.setattr(_tables, "host_processor", lambda: processor)
    return processor


def test_cpuinfo_is_read_from_its_first_processor() -> None:
    assert processor_of(_XEON_INFO) == HostProcessor(
        "GenuineIntel", 6, 85, "Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz"
    )
    assert processor_of(_ZEN5_INFO) == HostProcessor("AuthenticAMD", 26, 2, "AMD EPYC")
    # Fields a host does not have are unknown, not guessed.
    assert processor_of(_ARM_INFO) == HostProcessor("", None, None, "")
    assert processor_of("") == HostProcessor()


def test_each_processor_takes_the_table_measured_on_it() -> None:
    xeon, zen5 = (table.rates for table in CPU_TABLES)
    assert builtin_rates("cpu", processor_of(_XEON_INFO)) is xeon
    assert builtin_rates("cpu", processor_of(_ZEN5_INFO)) is zen5
    # The two hosts differ where a plan's choice turns: the Python around a call and
    # pointwise bytes, not matrix products.
    assert zen5.policy_call_seconds < xeon.policy_call_seconds / 2
    assert zen5.memory_bytes > 2 * xeon.memory_bytes
    assert 0.5 < zen5.matmul_flops / xeon.matmul_flops < 2
    # A processor a table was measured on adds nothing to the plan's note.
    assert cpu_table_note(processor_of(_XEON_INFO)) == cpu_table_note(processor_of(_ZEN5_INFO))
    assert cpu_table_note(processor_of(_ZEN5_INFO)) == ""


@pytest.mark.parametrize("cpuinfo", [_ZEN4_INFO, _ARM_INFO, ""], ids=["zen4", "arm", "none"])
def test_a_processor_no_table_was_measured_on_takes_the_first_and_says_so(cpuinfo: str) -> None:
    processor = processor_of(cpuinfo)
    assert builtin_rates("cpu", processor) is CPU_TABLES[0].rates
    note = cpu_table_note(processor)
    assert note.startswith(f"Built-in CPU rates of {CPU_TABLES[0].measured_on}: ")
    assert f"({processor.name or 'unknown'})" in note
    assert "checkpointing.calibrate_rates(save=True)" in note


def test_a_plan_on_an_unmatched_host_says_which_table_it_took(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.GELU()) for _ in range(4)])
    x = torch.randn(8, 16)
    _host(monkeypatch, _ZEN4_INFO)
    backend = accel.get_backend("cpu")
    assert host_rates(backend) == (CPU_TABLES[0].rates, cpu_table_note())
    plan = plan_checkpointing(model, (x,), memory_budget=0.5)
    assert plan.rates == CPU_TABLES[0].rates
    assert "no built-in table was measured on this host's processor (AMD EPYC)" in plan.note
    _host(monkeypatch, _ZEN5_INFO)
    plan = plan_checkpointing(model, (x,), memory_budget=0.5)
    assert plan.rates == CPU_TABLES[1].rates and "built-in table" not in plan.note
    # An accelerator's table has no host note.
    accelerator: Any = SimpleNamespace(device_type="hpu", name="hpu")
    assert host_rates(accelerator) == (builtin_rates("hpu"), "")


def test_every_table_is_valid_and_built_in() -> None:
    assert len({table.processor for table in CPU_TABLES}) == len(CPU_TABLES)
    for table in CPU_TABLES:
        rates = table.rates
        assert rates.device_type == "cpu" and rates.source == "built-in"
        values = {k: v for k, v in dataclasses.asdict(rates).items() if isinstance(v, float)}
        # A checkpoint's cost per saved tensor and attention's per score came after the
        # Zen 5 host was measured: that table leaves them at 0, pricing a checkpoint and
        # attention as they were measured there.
        later = ("region_tensor_seconds", "attention_score_seconds")
        measured = {k: v for k, v in values.items() if k not in later}
        assert all(math.isfinite(v) and v > 0 for v in measured.values()), table.processor
        assert all(math.isfinite(values[k]) and values[k] >= 0 for k in later)
        assert rates.region_seconds > 0 and rates.saved_call_seconds > 0
        assert all(v > 0 for v in rates.operator_bytes.values())
    assert CPU_TABLES[0].rates.region_tensor_seconds > 0
    assert CPU_TABLES[0].rates.attention_score_seconds > 0
