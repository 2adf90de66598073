"""Plans under timing noise: how many different plans one model, input and budget get.

Each zoo family (``benchmarks/_zoo.py``, small size) is planned at one budget once per
seed on the tests' simulated host (``tests/checkpointing/_simulated_host.py``): every
clock Python has runs by a cost model of each operator that runs, times seeded noise
(per-operator jitter, and a load factor that jumps between 1x and ``--load`` every 50
to 500 operators). Nothing reads real time, so the counts are the same on any machine
with the same torch. A family that is stable under noise gets one plan for every seed:
the whole plan as its JSON file holds it (revisions before plans had files: decisions,
kept calls, saved-tensor positions, the candidate taken).

Two conditions by default: a steady load (30% jitter, load 1x) and a jumping one (30%
jitter, load 1x to 3x). ``--before REV`` also plans with the ``accel``/``checkpointing``
packages of git revision REV, for a before/after table. Each family runs in a fresh
process.

Usage: python benchmarks/bench_stability.py [--model resnet,gpt2] [--seeds 12] [--before REV]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODELS = (
    "resnet",
    "gpt2",
    "bert",
    "vit",
    "llama",
    "custom",
    "lstm",
    "shared",
    "qwen2",
    "mae",
)
CONDITIONS = {"steady load": (0.3, 1.0), "load jumping 1-3x": (0.3, 3.0)}


def plans(family: str, seeds: int, jitter: float, load: float, budget: float) -> list[str]:
    """What each seed's planning decided, as comparable strings (run in a child process)."""
    import copy

    import torch

    from checkpointing import plan_checkpointing

    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT / "tests" / "checkpointing"))
    import _simulated_host as host
    import _zoo as zoo

    found = []
    for seed in range(seeds):
        case = zoo.build(family)
        with host.simulated(seed, jitter=jitter, load=load):
            plan = plan_checkpointing(copy.deepcopy(case.model), case.inputs, budget)
        if hasattr(plan, "to_dict"):  # the whole plan, as its file would hold it
            found.append(json.dumps(plan.to_dict(), sort_keys=True))
            continue
        saved = {name: sorted(p.positions.items()) for name, p in plan.saved_plans.items()}
        taken = [c.label for c in plan.considered if c.taken]
        found.append(repr((sorted(plan.decisions.items()), plan.kept_calls, saved, taken)))
    return found


def _child(
    family: str, args: argparse.Namespace, jitter: float, load: float, path: str | None
) -> list[str]:
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([path, env.get("PYTHONPATH", "")])
    command = [sys.executable, __file__, "--child", family, "--seeds", str(args.seeds)]
    command += ["--jitter", str(jitter), "--load", str(load), "--budget", str(args.budget)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=",".join(DEFAULT_MODELS), help="zoo families")
    parser.add_argument("--seeds", type=int, default=12, help="plannings per family (12)")
    parser.add_argument("--budget", type=float, default=0.5, help="memory budget (0.5)")
    parser.add_argument("--before", metavar="REV", default=None, help="also plan with REV")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--jitter", type=float, default=0.3, help=argparse.SUPPRESS)
    parser.add_argument("--load", type=float, default=1.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(plans(args.child, args.seeds, args.jitter, args.load, args.budget)))
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _report import checkout, print_table, write_results

    families = args.model.split(",")
    trees: list[tuple[str, str | None]] = [("this tree", None)]
    results: dict[str, dict[str, dict[str, int]]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        if args.before is not None:
            trees.insert(0, (args.before, checkout(args.before, scratch)))
        for tree, path in trees:
            for condition, (jitter, load) in CONDITIONS.items():
                for family in families:
                    found = _child(family, args, jitter, load, path)
                    counts = Counter(found)
                    row = results.setdefault(family, {})
                    row[f"{condition} ({tree})"] = len(counts)
                    print(f"{family}, {condition}, {tree}: {len(counts)} plans", file=sys.stderr)
    columns = [f"{condition} ({tree})" for tree, _ in trees for condition in CONDITIONS]
    print_table(
        ("model", *columns),
        [(family, *(results[family][c] for c in columns)) for family in families],
    )
    import torch

    out = write_results(
        "stability",
        "simulated",
        {
            "seeds": args.seeds,
            "budget": args.budget,
            "conditions": {k: {"jitter": j, "load": load} for k, (j, load) in CONDITIONS.items()},
            "torch_version": torch.__version__,
            "distinct_plans": results,
        },
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
