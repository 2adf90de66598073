"""bench_budget's judgements on synthetic rows: dominance by a fixed rule, and the noise.

The figures a run measures go through ``benchmarks/_budget_checks.py``; here they are
made up, so that each verdict is known: a rule dominates a plan only when it keeps no
more memory and is faster by more than 0.03, the noise is the larger of plain
against plain and one plan against itself, and each row's 95% interval holds the median
of its per-round ratios as often as it says.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _benchmarks_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))


def _row(memory: float, time: float) -> dict[str, Any]:
    return {"bytes_ratio": memory, "time_ratio": time}


def _rows(**rules: tuple[float, float]) -> dict[str, dict[str, Any]]:
    """The planner's plans of a run (GPT-2 on the GPU, issue 40) and the given rules."""
    rows = {
        "plain": _row(1.0, 1.0),
        "plain again": _row(1.0, 1.01),
        "budget 0.75": _row(0.74, 1.03),
        "budget 0.5": _row(0.48, 1.09),
        "budget 0.5 again": _row(0.48, 1.30),  # a repeat: never judged
        "budget 0.25": _row(0.25, 1.20),
        "full": _row(0.05, 1.30),
    }
    names = {"selective": "torch selective", "titan": "torchtitan op rule"}
    for key, (memory, time) in rules.items():
        rows[names[key]] = _row(memory, time)
    return rows


def test_a_rule_with_less_memory_and_a_faster_step_dominates_the_plans_it_beats() -> None:
    from _budget_checks import at_memory, dominance

    rows = _rows(titan=(0.39, 1.05), selective=(0.52, 1.08))
    rows[at_memory("torchtitan op rule")] = _row(0.39, 1.07)
    judged = dominance(rows)
    titan = judged["rules"]["torchtitan op rule"]
    assert judged["dominated"] and titan["dominates"]
    assert [b["plan"] for b in titan["beats"]] == ["budget 0.5"]  # 0.48x at 1.09x
    assert titan["beats"][0]["faster_by"] == pytest.approx(0.04)
    assert titan["plan_at_its_memory"] == _row(0.39, 1.07)  # within 0.03: not beaten
    selective = judged["rules"]["torch selective"]
    assert not selective["dominates"] and selective["plan_at_its_memory"] is None


@pytest.mark.parametrize(
    ("rule", "why"),
    [
        ((0.49, 1.00), "keeps more memory than the 0.5 plan (0.48x), beats no plan"),
        ((0.39, 1.06), "faster than the 0.5 plan by exactly 0.03, not more"),
    ],
)
def test_no_dominance_with_more_memory_or_within_the_margin(
    rule: tuple[float, float], why: str
) -> None:
    from _budget_checks import dominance

    rows = _rows(titan=rule)
    rows["budget 0.75"] = _row(0.74, 1.0)  # the 0.75 plan is not slower than any rule
    rows["budget 0.25"] = _row(0.25, 1.0)
    judged = dominance(rows)
    assert not judged["dominated"], why
    assert judged["rules"]["torchtitan op rule"]["beats"] == []


def test_the_count_over_families_leaves_out_families_without_rules() -> None:
    from _budget_checks import count_dominated, dominance

    results = [
        {"model": "gpt2", "dominance": dominance(_rows(titan=(0.39, 1.05)))},
        {"model": "bert", "dominance": dominance(_rows(titan=(0.60, 1.00)))},
        {"model": "lstm", "dominance": dominance(_rows())},  # the rules were unavailable
    ]
    assert count_dominated(results) == {
        "dominated": 1,
        "families": 2,
        "names": ["gpt2"],
        "target": 0,
    }


def test_the_noise_is_the_larger_pair_and_agreement_is_within_003() -> None:
    from _budget_checks import noise

    plain = [1.0, 1.0, 1.0]
    times = {
        "plain": plain,
        "plain again": [1.02, 0.99, 1.01],  # median ratio 1.01
        "budget 0.5": [1.20, 1.20, 1.20],
        "budget 0.5 again": [1.25, 1.22, 1.26],  # median ratio 1.25: 0.05 apart
    }
    found = noise(times, "budget 0.5")
    assert found["plain_vs_plain"] == pytest.approx(0.01)
    assert found["plan_vs_plan"] == pytest.approx(0.05)
    assert found["noise"] == pytest.approx(0.05) and not found["agreed"]
    assert found["rounds"] == 3
    times["budget 0.5 again"] = [1.21, 1.22, 1.19]
    assert noise(times, "budget 0.5")["agreed"]
    alone = noise(times, None)  # no 0.5 plan: the plain pair only
    assert alone["plan_vs_plan"] is None and alone["noise"] == pytest.approx(0.01)


def test_the_bench_takes_rounds_until_the_pairs_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    import bench_budget

    seconds = iter([1.0, 1.3, 1.0, 1.0] * 3 + [1.0] * 400)  # the first rounds disagree
    monkeypatch.setattr(bench_budget, "step", lambda case, model, backend: next(seconds))
    models = dict.fromkeys(["plain", "plain again", "budget 0.5", "budget 0.5 again"])
    args = bench_budget.parse_args(["--steps", "2", "--max-steps", "40", "--warmup", "0"])
    times, faults, found = bench_budget._time_rounds(None, models, list(models), None, args)
    assert found["agreed"] and 2 < found["rounds"] < 40
    assert all(len(series) == found["rounds"] for series in times.values())
    assert all(len(counts) == found["rounds"] for counts in faults.values())
    assert all(count >= 0 for counts in faults.values() for count in counts)
    args = bench_budget.parse_args(["--steps", "2", "--max-steps", "3", "--warmup", "0"])
    seconds = iter([1.0, 1.3] * 400)
    _, _, capped = bench_budget._time_rounds(None, models, list(models), None, args)
    assert capped["rounds"] == 3 and not capped["agreed"]


def test_the_median_interval_is_the_order_statistics_the_binomial_gives() -> None:
    import random

    from _budget_checks import median_interval

    ratios = [float(rank) for rank in range(1, 101)]
    random.Random(0).shuffle(ratios)
    # n = 100: ranks floor((100 - 19.6) / 2) = 40 and ceil(1 + (100 + 19.6) / 2) = 61.
    assert median_interval(ratios) == (40.0, 61.0)
    # Too few rounds for 95%: the whole range, never a narrower interval than earned.
    assert median_interval([1.3, 1.1, 1.2, 1.0]) == (1.0, 1.3)
    assert median_interval([1.2]) == (1.2, 1.2)
    with pytest.raises(ValueError, match="needs at least one ratio"):
        median_interval([])


def test_the_median_interval_holds_the_median_about_95_percent_of_the_time() -> None:
    import math
    import random

    from _budget_checks import median_interval

    # Skewed rounds, as a shared host's are: exponential, whose median is ln 2.
    draw = random.Random(1)
    held = 0
    for _ in range(2000):
        low, high = median_interval([draw.expovariate(1.0) for _ in range(40)])
        held += low <= math.log(2) <= high
    assert 0.93 <= held / 2000 <= 0.99


def test_the_bench_takes_rounds_until_every_interval_is_narrow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import bench_budget

    # Plain against plain agrees from the first round, but the plan's rounds swing by
    # 0.5: the pairs alone would stop at once.
    calls = {"plain": 0, "plain again": 0, "budget 0.5": 0}

    def step(case: object, model: str, backend: object) -> float:
        calls[model] += 1
        return 1.0 + 0.5 * (model == "budget 0.5" and calls[model] % 2 == 0)

    monkeypatch.setattr(bench_budget, "step", step)
    models: dict[str, Any] = {name: name for name in calls}
    args = bench_budget.parse_args(["--steps", "2", "--max-steps", "30", "--warmup", "0"])
    _, _, found = bench_budget._time_rounds(None, models, list(models), None, args)
    assert found["noise"] == 0 and not found["agreed"] and found["rounds"] == 30
    assert found["widest"]["variant"] == "budget 0.5"
    assert found["widest"]["half_width"] == pytest.approx(0.25)
    # Wider allowed: the same rounds stop at --steps.
    args = bench_budget.parse_args(["--steps", "2", "--max-steps", "30", "--within", "0.3"])
    args.warmup = 0
    _, _, loose = bench_budget._time_rounds(None, models, list(models), None, args)
    assert loose["agreed"] and loose["rounds"] == 2


def _rates_file(
    tmp_path: Path, runs: dict[str, dict[str, Any]], cpu: dict[str, Any] | None = None
) -> Path:
    import json

    path = tmp_path / "rates-cpu-20261128.json"
    values: dict[str, Any] = {"benchmark": "rates", "backend": "cpu", "runs": runs}
    if cpu is not None:
        values["machine"] = {"cpu": cpu}
    path.write_text(json.dumps(values))
    return path


def _run(scale: float, **operators: float) -> dict[str, Any]:
    from _rates_runs import GENERAL

    return {
        "device_type": "cpu",
        "source": "calibrated",
        **{name: scale for name in GENERAL},
        "operator_bytes": operators,
    }


def test_out_of_sample_rates_are_the_medians_without_the_familys_own_run(
    tmp_path: Path,
) -> None:
    from _rates_runs import left_out

    runs = {
        "plain 0": _run(1.0),
        "gpt2": _run(2.0, **{"aten.gelu.default": 5.0}),
        "bert": _run(3.0, **{"aten.gelu.default": 7.0, "aten.tanh.default": 9.0}),
    }
    path = _rates_file(tmp_path, runs)
    without_bert = left_out(path, "bert")
    assert without_bert.matmul_flops == 1.5 and without_bert.hook_seconds == 1.5
    # tanh was timed only by bert: out of sample it falls back to the general byte rate.
    assert dict(without_bert.operator_bytes) == {"aten.gelu.default": 5.0}
    assert without_bert.source == "rates-cpu-20261128.json without bert"
    without_gpt2 = left_out(path, "gpt2")
    assert without_gpt2.memory_bytes == 2.0
    assert dict(without_gpt2.operator_bytes) == {
        "aten.gelu.default": 7.0,
        "aten.tanh.default": 9.0,
    }


def test_out_of_sample_takes_every_run_for_a_family_without_one_and_refuses_another_file(
    tmp_path: Path,
) -> None:
    from _rates_runs import left_out

    # No run of gpt2: every run is out of sample for it, and the source says why.
    path = _rates_file(tmp_path, {"plain 0": _run(1.0), "plain 1": _run(3.0)})
    rates = left_out(path, "gpt2")
    assert rates.matmul_flops == 2.0 and rates.source.endswith("which has no run of gpt2")
    other = tmp_path / "budget.json"
    other.write_text('{"benchmark": "budget", "models": []}')
    with pytest.raises(SystemExit, match="not a results file of benchmarks/bench_rates"):
        left_out(other, "gpt2")


def test_runs_older_than_the_call_costs_read_them_from_the_built_in_table(
    tmp_path: Path,
) -> None:
    from _rates_runs import left_out

    from checkpointing.planner._tables import CPU_TABLES

    # Runs calibrated before a checkpoint's and a saved-grain call's own costs were
    # measured: out of sample, those costs are the built-in table's (timed on small
    # chains, not on any family), not 0, which would price both as free. The table is
    # that of the host the file was measured on, whichever host reads it: files that do
    # not name their processor come from the first table's host.
    old = {
        name: value
        for name, value in _run(1.0).items()
        if name not in ("region_seconds", "saved_call_seconds")
    }
    rates = left_out(_rates_file(tmp_path, {"plain 0": old, "bert": _run(2.0)}), "bert")
    first, zen5 = CPU_TABLES[0].rates, CPU_TABLES[1].rates
    assert rates.region_seconds == first.region_seconds > 0
    assert rates.saved_call_seconds == first.saved_call_seconds > 0
    assert rates.matmul_flops == 1.0
    cpu = {"vendor": "AuthenticAMD", "family": 26, "model": 2, "name": "AMD EPYC"}
    rates = left_out(_rates_file(tmp_path, {"plain 0": old}, cpu), "bert")
    assert rates.region_seconds == zen5.region_seconds != first.region_seconds
    # Where the runs have them, their median is taken, as for every other rate.
    both = left_out(_rates_file(tmp_path, {"plain 0": _run(1.0), "plain 1": _run(3.0)}), "x")
    assert both.region_seconds == both.saved_call_seconds == 2.0


def test_runs_older_than_the_score_cost_read_attentions_rate_from_the_table_too(
    tmp_path: Path,
) -> None:
    from _rates_runs import left_out

    from checkpointing.planner._tables import CPU_TABLES

    # Attention timed before its cost per score was split off has the softmax inside
    # its flop rate: with the table's cost per score added it would be priced twice, so
    # such runs read both from the table; their other rates stay theirs.
    old = {name: value for name, value in _run(1.0).items() if name != "attention_score_seconds"}
    rates = left_out(_rates_file(tmp_path, {"plain 0": old, "bert": _run(2.0)}), "bert")
    table = CPU_TABLES[0].rates
    assert rates.attention_flops == table.attention_flops != 1.0
    assert rates.attention_score_seconds == table.attention_score_seconds > 0
    assert rates.matmul_flops == 1.0
    new = left_out(_rates_file(tmp_path, {"plain 0": _run(1.0), "bert": _run(2.0)}), "bert")
    assert new.attention_flops == new.attention_score_seconds == 1.0


def test_fused_attention_switches_off_attention_dropout_and_nothing_else() -> None:
    from _fused_attention import without_attention_dropout
    from _zoo import build

    from checkpointing import profile_step

    case = build("shared", "small")
    dropouts = {
        name: module.p for name, module in case.model.named_modules() if hasattr(module, "p")
    }
    assert without_attention_dropout(case.model) == ["layer.self_attn.dropout"]
    assert case.model.layer.self_attn.dropout == 0.0
    # The layers' own dropout stays as it was.
    assert dropouts == {
        name: module.p for name, module in case.model.named_modules() if hasattr(module, "p")
    }
    assert without_attention_dropout(case.model) == []
    recorded = profile_step(case.model, case.inputs, backend="cpu")
    fused = {w.operator for w in recorded.forward if w.kind == "attention"}
    assert fused == {"aten._scaled_dot_product_flash_attention_for_cpu.default"}


def test_a_looser_budget_slower_by_more_than_003_is_a_finding_unless_the_plan_is_the_same() -> None:
    from _budget_checks import budget_order, count_looser_slower

    rows = _rows()  # 0.75: 1.03x, 0.5: 1.09x, 0.25: 1.20x: in order
    assert budget_order(rows)["slower"] == [] and not budget_order(rows)["looser_slower"]
    rows["budget 0.75"] = {**_row(0.74, 1.13), "plan_digest": "a"}
    rows["budget 0.5"] = {**_row(0.48, 1.09), "plan_digest": "b"}
    rows["budget 0.5 again"] = _row(0.48, 1.50)  # a repeat: never judged
    found = budget_order(rows)
    assert [(p["looser"], p["tighter"]) for p in found["slower"]] == [("budget 0.75", "budget 0.5")]
    assert found["slower"][0]["slower_by"] == pytest.approx(0.04)
    assert found["looser_slower"]
    rows["budget 0.5"]["plan_digest"] = "a"  # one plan timed twice: the run's noise
    same = budget_order(rows)
    assert same["slower"][0]["same_plan"] and not same["looser_slower"]
    rows["budget 0.75"] = {**_row(0.74, 1.12), "plan_digest": "a"}  # 0.03: within
    assert budget_order(rows)["slower"] == []
    results = [
        {"model": "lstm", "budget_order": same},
        {"model": "gpt2", "budget_order": found},
        {"model": "bert", "budget_order": budget_order(_rows())},
    ]
    count = count_looser_slower(results)
    assert count["looser_slower"] == 1 and count["names"] == ["gpt2"]
    assert count["same_plan_only"] == ["lstm"] and count["families"] == 3


def test_a_compiled_plan_is_judged_against_its_compiled_estimate() -> None:
    from _compiled_plan import judge

    # ResNet at the small size under inductor (2026-11-29): the plan kept 0.23x, its
    # compiled estimate with two generator states 0.28x, and the compiled step 0.282x.
    plain = {"graph_breaks": 0, "bytes_ratio": 0.98}
    planned = {
        "bytes_ratio": 0.282,
        "estimated_bytes_ratio": 0.229,
        "estimated_compiled_bytes_ratio": 0.282,
        "graph_breaks": 0,
        "bit_equal": True,
        "grad_difference": 0.0,
    }
    verdict = judge({"compiled": plain, "compiled, plan 0.5": planned})
    assert verdict is not None and verdict["met"]
    assert verdict["limit"] == pytest.approx(0.302) and verdict["eager_estimate"] == 0.229
    # A plan saved before the compiled estimate was recorded: its eager estimate.
    older = {**planned, "estimated_compiled_bytes_ratio": None}
    verdict = judge({"compiled": plain, "compiled, plan 0.5": older})
    assert verdict is not None and not verdict["within_estimate"] and not verdict["met"]
    # Over the compiled estimate by more than 2%, or a break added: missed.
    over = {**planned, "bytes_ratio": 0.31}
    assert not judge({"compiled": plain, "compiled, plan 0.5": over})["met"]
    broken = {**planned, "graph_breaks": 1}
    assert not judge({"compiled": plain, "compiled, plan 0.5": broken})["met"]


def test_the_targets_rows_time_plain_twice_and_the_three_budgets_only() -> None:
    import bench_budget

    import accel

    args = bench_budget.parse_args(
        ["--size", "small", "--rows", "targets", "--warmup", "0", "--steps", "1"]
    )
    args.max_steps = 1
    result = bench_budget.run_case("custom", accel.get_backend("cpu"), args)
    rows = result["variants"]
    assert list(rows) == ["plain", "plain again", "budget 0.75", "budget 0.5", "budget 0.25"]
    assert result["unavailable"] == {} and result["dominance"]["rules"] == {}
    # One round: each interval is that round's ratio, plain's is 1.
    assert rows["plain"]["interval"] == [1.0, 1.0]
    for row in rows.values():
        low, high = row["interval"]
        assert low == high == pytest.approx(row["measured"]) and row["exact"]
    summary = result["summary_at_half"]
    assert summary is not None and summary["not_slower_than_full"] is None
    assert summary["interval"] == rows["budget 0.5"]["interval"]


def test_each_kind_of_run_writes_a_file_of_its_own() -> None:
    import bench_budget

    def name(*argv: str) -> str:
        args = bench_budget.parse_args(list(argv))
        names = ["gpt2", "bert"] if args.model != "all" else list(bench_budget.FAMILIES)
        return bench_budget.results_name(args, names)

    assert name() == "budget"
    assert name("--model", "gpt2,bert") == "budget-gpt2-bert"
    assert name("--model", "gpt2,bert", "--rows", "targets") == "budget-gpt2-bert-targets"
    # An out-of-sample run plans with other rates: it never replaces an in-sample file.
    assert (
        name("--rows", "targets", "--out-of-sample", "rates.json") == "budget-targets-out-of-sample"
    )
    assert name("--size", "small", "--compile") == "budget-compile-small"
    assert name("--rows", "targets", "--fused-attention") == "budget-targets-fused-attention"


def test_per_call_times_each_saved_grain_call_of_the_plan_four_ways() -> None:
    import copy

    import _zoo
    from _saved_calls import per_call

    from checkpointing import plan_checkpointing

    case = _zoo.build("qwen2", "small")
    plan = plan_checkpointing(copy.deepcopy(case.model), case.inputs, 0.5)
    saved = [n for n, d in plan.choices.items() if d.grain == "recompute saved"]
    assert saved  # the small Qwen2's 0.5 plan has a saved-grain call to time
    result = per_call("qwen2", 0.5, rounds=2, size="small")
    calls = result["calls"]
    assert [call["module"] for call in calls] == saved
    for call in calls:
        assert set(call["extra_seconds"]) == {"bare hooks", "wrapper, nothing planned", "plan"}
        assert call["plain_seconds"] > 0 and call["saved_tensors"] > 0
        assert call["estimated_seconds"] == next(
            row.recompute_seconds for row in plan.rows if row.module == call["module"]
        )


def test_by_decision_splits_the_plan_into_each_decisions_rows_and_their_estimate() -> None:
    import copy

    import _zoo
    import torch
    from bench_budget_breakdown import by_decision

    from checkpointing import plan_checkpointing
    from checkpointing.planner._tables import CPU_TABLES

    case = _zoo.build("qwen2", "small")
    # The Xeon table on every host: its 0.5 plan of the small Qwen2 takes two grains.
    rates = CPU_TABLES[0].rates
    plan = plan_checkpointing(copy.deepcopy(case.model), case.inputs, 0.5, rates=rates)
    parts = by_decision(plan)
    taken = {row.decision for row in plan.rows} - {"keep"}
    assert set(parts) == taken and len(taken) > 1  # more than one grain to tell apart
    seen: set[str] = set()
    for decision, (part, seconds) in parts.items():
        assert part.choices and {d.grain for d in part.choices.values()} == {decision}
        assert not seen & set(part.choices)
        seen |= set(part.choices)
        rows = [r for r in plan.rows if r.decision == decision]
        assert seconds == sum(r.recompute_seconds for r in rows) > 0
    assert seen == {n for n, d in plan.choices.items() if d.grain != "keep"}
    # Each part is a plan of its own: it applies and trains.
    for part, _ in parts.values():
        model = copy.deepcopy(case.model)
        part.apply(model)
        torch.autograd.backward(case.loss(model))


def test_the_backward_bench_sets_each_estimate_beside_the_measured_split() -> None:
    import bench_backward
    from _zoo import build

    from accel import get_backend
    from accel._compat import fake_profile_unavailable

    backend = get_backend("cpu")
    lstm, custom = (build(family, "small") for family in ("lstm", "custom"))
    one_forward = bench_backward.estimated(lstm, backend)
    assert one_forward["fallback"] and one_forward["recorded"] is None
    assert one_forward["twice_the_forward_ratio"] == 2.0
    assert 1.0 < one_forward["call_by_call_ratio"] < 2.0  # products twice, draws free
    recorded = bench_backward.estimated(custom, backend)
    if fake_profile_unavailable() is None:
        assert not recorded["fallback"] and recorded["recorded_ratio"] > 0
    else:  # torch 2.4 profiles every model on real tensors: no backward is recorded
        assert recorded["fallback"] and recorded["recorded"] is None
    timed = bench_backward.measured(custom, backend, rounds=1)
    assert timed["ratio"] == timed["backward_seconds"] / timed["forward_seconds"] > 0


def test_the_pointwise_bench_prices_each_table_beside_the_profiled_step(tmp_path: Path) -> None:
    import json

    import bench_pointwise
    import torch
    from _zoo import build

    from accel import get_backend
    from checkpointing.planner import builtin_rates
    from checkpointing.planner._pricing import by_bytes
    from checkpointing.planner._work import op_work

    backend = get_backend("cpu")
    # A table from a bench_rates.py file at half the built-in byte rates.
    built_in = builtin_rates("cpu").to_dict()
    halved = {
        **built_in,
        "memory_bytes": built_in["memory_bytes"] / 2,
        "operator_bytes": {k: v / 2 for k, v in built_in["operator_bytes"].items()},
    }
    path = tmp_path / "rates.json"
    path.write_text(json.dumps({"benchmark": "rates", "runs": {"one": halved}}))
    tables = {"built-in": builtin_rates("cpu"), "halved": bench_pointwise.table(str(path), backend)}
    custom = build("custom", "small")
    seconds, operators, forward_only = bench_pointwise.priced(custom, backend, tables)
    assert operators and seconds["built-in"] < seconds["halved"] < 2 * seconds["built-in"]
    real = bench_pointwise.measured(custom, backend, operators, forward_only, rounds=1)
    assert real > 0
    # Products, random draws and unwritten allocations are not priced by bytes.
    aten, x = torch.ops.aten, torch.ones(8, 8)
    assert by_bytes(op_work(aten.gelu.default, (x,), {}, x, 256))
    assert not by_bytes(op_work(aten.mm.default, (x, x), {}, x, 256))
    assert not by_bytes(op_work(aten.empty_like.default, (x,), {}, x, 256))


def test_the_per_family_benches_build_each_usable_family_at_its_size(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    import _per_family
    import torch

    from accel import get_backend

    parser = argparse.ArgumentParser()
    _per_family.add_family_arguments(parser, rounds=7, what="steps")
    args = parser.parse_args(["--model", "lstm,unusable,custom", "--size", "small"])
    assert args.rounds == 7 and args.threads == 1 and "mamba" not in parser.get_default("model")
    monkeypatch.setattr(
        _per_family, "unusable", lambda family: "not here" if family == "unusable" else None
    )
    threads = torch.get_num_threads()
    try:
        cases = list(_per_family.built(args, get_backend("cpu")))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    assert [case.family for case in cases] == ["lstm", "custom"]
    assert "unusable: skipped (not here)" in capsys.readouterr().err


def test_the_operators_alone_bound_lies_under_every_plan_and_tightens_with_the_budget() -> None:
    import copy

    from _zoo import build
    from bench_budget_bound import family_bounds, no_margins, operators_alone

    import accel
    from checkpointing.planner import builtin_rates, cost, profile_step
    from checkpointing.planner._grains._registry import GRAINS

    case = build("gpt2", "small")
    profile = cost(profile_step(copy.deepcopy(case.model), case.inputs), builtin_rates("cpu"))
    bounds = [operators_alone(profile, budget) for budget in (1.0, 0.75, 0.5, 0.25)]
    assert bounds[0] == 1.0 and bounds == sorted(bounds) and bounds[-1] > 1.0
    margins = [grain.margin for grain in GRAINS]
    assert any(margins)
    with no_margins():
        assert all(grain.margin == 0.0 for grain in GRAINS)
    assert [grain.margin for grain in GRAINS] == margins
    rows = family_bounds(case, accel.get_backend("cpu"), rounds=2)
    assert rows["time_target"] == 1.15
    for row in rows["budgets"].values():
        # No plan is faster than its operators alone, and the search without margins
        # takes the plan it prices lowest.
        assert 1.0 < row["operators_alone"] <= row["no_margins"] <= row["planned"] + 1e-12
    # Timed at 0.5 only: each plan's step over the plain step's.
    assert set(rows["budgets"]["0.5"]["measured"]) == {"planned", "no_margins"}
    assert "measured" not in rows["budgets"]["0.25"]
    assert all(ratio > 0 for ratio in rows["budgets"]["0.5"]["measured"].values())
