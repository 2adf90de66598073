"""Run alone (``python one_process.py OUT [deepspeed]``, ``ACCEL`` set): both frameworks.

Trains the shared model with Lightning's Trainer (``trainer_kwargs()``) and Fabric
(``fabric_kwargs()``), and with DeepSpeed ZeRO stages 1, 2 and 3 (3 also with optimizer
and parameters offloaded to the CPU) after ``install()``, on the backend
``accel.get_backend()`` picks, none of them with code of the backend's own, and saves
the parameters next to the plain loop's, with what ``install()`` warned when called
again once DeepSpeed's communication exists. On the ``recording`` backend it also saves
the protocol members each DeepSpeed run called. With ``deepspeed`` after ``OUT`` it runs
DeepSpeed alone (Lightning is not even imported: seconds saved).
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
import torch

os.environ.update(common.single_process_env())

import accel


def parameters(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def main() -> None:
    backend = accel.get_backend()
    results: dict[str, object] = {
        "backend": backend.name,
        "plain": parameters(common.plain_sgd(common.make_model(), common.batches())),
    }
    if sys.argv[2:] != ["deepspeed"]:
        from accel.integrations.lightning import fabric_kwargs, trainer_kwargs

        model = common.make_model()
        with common.framework_warnings():
            common.fit(trainer_kwargs(), common.lightning_module(model), common.batches())
        results["lightning"] = parameters(model)
        model = common.make_model()
        common.fabric_sgd(fabric_kwargs(), model, common.batches())
        results["fabric"] = parameters(model)

    if common.deepspeed_installed():
        from accel.integrations.deepspeed import install

        results["deepspeed_backend"] = install().backend.name
        calls = getattr(backend, "call_names", None)  # the recording backend's
        for name, zero in common.ZERO_CONFIGS.items():
            before = len(calls()) if calls else 0
            results[name] = common.deepspeed_sgd(common.make_model(), common.batches(), zero)
            if calls:
                results[name]["calls"] = sorted(set(calls()[before:]))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            install()
        results["late_warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
    results["deterministic"] = torch.are_deterministic_algorithms_enabled()
    torch.save(results, sys.argv[1])


if __name__ == "__main__":
    main()
