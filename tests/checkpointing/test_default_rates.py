"""The rates planning takes by default: this host's cache, else the built-in ones (issue 40).

A cache in the layout written before rate caches recorded a format still loads; a file
this release cannot read is refused with a warning that names its format and what to
do, and the built-in rates are taken. A plan made with a cache's rates names the file
and the rates' source in its note, so that two machines' plans can be told apart.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from torch import nn

import accel
from checkpointing import DeviceRates, default_rates, plan_checkpointing
from checkpointing.planner import _tables, builtin_rates, rates_cache_path
from checkpointing.planner._default_rates import RATES_FORMAT, host_rates, save_rates
from checkpointing.planner._tables import HostProcessor

# A rate cache as calibrate_rates(save=True) wrote it before the format was recorded:
# DeviceRates.to_dict(), indented, with no "format".
_UNVERSIONED = """{
 "device_type": "cpu",
 "source": "calibrated on Test CPU, 1 threads, torch 2.13.0, 2026-11-28",
 "matmul_flops": 61800000000.0,
 "attention_flops": 46200000000.0,
 "convolution_flops": 54800000000.0,
 "memory_bytes": 16200000000.0,
 "random_bytes": 341000000.0,
 "call_seconds": 3.29e-06,
 "policy_call_seconds": 0.000162,
 "policy_kept_seconds": 0.00014,
 "hook_seconds": 2.35e-06,
 "operator_bytes": {
  "aten.gelu.default": 4350000000.0,
  "aten.native_layer_norm.default": 9590000000.0
 }
}
"""


@pytest.fixture(autouse=True)
def _cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path))


def _cache(text: str) -> Path:
    path = rates_cache_path(accel.get_backend("cpu"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _model() -> nn.Module:
    return nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.GELU()) for _ in range(4)])


def test_without_a_cache_the_built_in_rates_and_no_note(monkeypatch: pytest.MonkeyPatch) -> None:
    # On a processor a built-in table was measured on (elsewhere the note names the
    # table taken: test_rate_tables.py).
    zen5 = HostProcessor("AuthenticAMD", 26, 2, "AMD EPYC")
    monkeypatch.setattr(_tables, "host_processor", lambda: zen5)
    backend = accel.get_backend("cpu")
    assert not rates_cache_path(backend).exists()
    assert default_rates(backend) == builtin_rates("cpu")
    assert host_rates(backend) == (builtin_rates("cpu"), "")


def test_a_cache_without_a_format_still_loads() -> None:
    path = _cache(_UNVERSIONED)
    rates = default_rates(accel.get_backend("cpu"))
    # Copy rates, the saved grain's replay and pack, a checkpoint's and a saved-grain
    # call's own costs and attention's cost per score came later: a file without them
    # reads their defaults (the last four as 0: priced as before).
    defaults = {
        "to_host_bytes": 25e9,
        "to_device_bytes": 25e9,
        "replay_seconds": 1e-4,
        "pack_bytes": 9.5e8,
        "region_seconds": 0.0,
        "saved_call_seconds": 0.0,
        "region_tensor_seconds": 0.0,
        "attention_score_seconds": 0.0,
    }
    assert rates.to_dict() == {**json.loads(_UNVERSIONED), **defaults}
    assert rates.source == "calibrated on Test CPU, 1 threads, torch 2.13.0, 2026-11-28"
    assert rates.operator_bytes["aten.gelu.default"] == 4.35e9
    assert path.is_file()


def test_saved_rates_record_their_format_and_read_back() -> None:
    backend = accel.get_backend("cpu")
    rates = dataclasses.replace(builtin_rates("cpu"), source="calibrated on a test host")
    path = save_rates(rates, backend)
    assert path == rates_cache_path(backend)
    assert json.loads(path.read_text())["format"] == RATES_FORMAT == "accel.device-rates/1"
    assert default_rates(backend) == rates


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{not json", "does not read as JSON"),
        ("[]", "holds a JSON list"),
        ('{"format": "accel.device-rates/2"}', "of format 'accel.device-rates/2', and this"),
        ('{"device_type": "cpu"}', "missing: \\['attention_flops'"),
        ('{"device_type": "cuda", "source": "x"}', "for the device type 'cuda', not 'cpu'"),
        (
            _UNVERSIONED.replace("61800000000.0", "-1.0"),
            "DeviceRates.matmul_flops is -1.0",
        ),
    ],
)
def test_a_cache_this_release_cannot_read_is_refused_with_a_sentence(
    text: str, reason: str
) -> None:
    path = _cache(text)
    with pytest.warns(UserWarning, match=reason) as caught:
        rates = default_rates(accel.get_backend("cpu"))
    assert rates == builtin_rates("cpu")
    message = str(caught[0].message)
    assert message.startswith(f"checkpointing: the cached device rates in {path} were not used")
    assert "calibrate_rates(save=True)" in message and message.endswith(".")


def test_another_format_is_named_with_the_one_this_release_reads() -> None:
    _cache(json.dumps({"format": "accel.device-rates/2", **json.loads(_UNVERSIONED)}))
    with pytest.warns(UserWarning) as caught:
        default_rates(accel.get_backend("cpu"))
    message = str(caught[0].message)
    assert "'accel.device-rates/2'" in message and "'accel.device-rates/1'" in message


def test_a_plan_names_the_cache_whose_rates_it_used() -> None:
    path = _cache(_UNVERSIONED)
    x = torch.randn(8, 16)
    plan = plan_checkpointing(_model(), (x,), memory_budget=0.75)
    assert plan.rates == DeviceRates.from_dict(json.loads(_UNVERSIONED))
    assert f"Rates from this host's cache {path}: calibrated on Test CPU" in plan.note
    assert str(path) in str(plan)
    # Rates given for the plan: no cache is read, none is named.
    given = plan_checkpointing(_model(), (x,), memory_budget=0.75, rates=builtin_rates("cpu"))
    assert "cache" not in given.note and given.rates == builtin_rates("cpu")


def test_a_plan_says_when_a_cache_was_refused() -> None:
    path = _cache('{"format": "accel.device-rates/2"}')
    with pytest.warns(UserWarning, match="were not used"):
        plan = plan_checkpointing(_model(), (torch.randn(8, 16),), memory_budget=0.75)
    assert plan.rates == builtin_rates("cpu")
    assert f"Built-in rates: this host's cached rates in {path} were refused" in plan.note
