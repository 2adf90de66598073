"""What the framework tests and their torchrun scripts share: model, data, reference loop.

Every run trains ``make_model()`` with SGD on ``batches()``; ``plain_sgd`` is the plain
torch loop the frameworks are compared with. Frameworks are imported inside functions,
so importing this module needs neither.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

LR = 0.1
STEPS = 3
BATCH = 8


DEEPSPEED_MISSING = (
    "DeepSpeed is not installed (pip install '.[deepspeed]'; its sdist needs torch installed first)"
)


def deepspeed_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("deepspeed") is not None


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def batches(seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(BATCH, 4, generator=generator), torch.randn(BATCH, 1, generator=generator))
        for _ in range(STEPS)
    ]


def plain_sgd(model: nn.Module, data: list[tuple[torch.Tensor, torch.Tensor]]) -> nn.Module:
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for x, y in data:
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return model


def assert_equal_to_plain(model: nn.Module) -> None:
    """Assert ``model``'s parameters are exactly the plain loop's (naming the first that is not)."""
    reference = plain_sgd(make_model(), batches())
    for (name, got), expected in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert torch.equal(got, expected), name


def shard(
    data: list[tuple[torch.Tensor, torch.Tensor]], rank: int, world: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's rows of every batch (DDP and ZeRO average gradients over ranks)."""
    return [(x.chunk(world)[rank], y.chunk(world)[rank]) for x, y in data]


@contextlib.contextmanager
def framework_warnings() -> Iterator[None]:
    """Silence advice the frameworks print on every run (pytest turns warnings into errors).

    Lightning: PossibleUserWarning (few DataLoader workers, no logger), and its own
    ``_pytree`` module's use of ``LeafSpec``, which torch 2.10 and later deprecate.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
        try:
            from lightning.fabric.utilities.warnings import PossibleUserWarning

            warnings.filterwarnings("ignore", category=PossibleUserWarning)
        except ImportError:
            pass
        yield


def autocast_state(out: torch.Tensor) -> dict[str, Any]:
    """The output's dtype and, per device type, whether autocast is on and its dtype."""
    state: dict[str, Any] = {"out_dtype": out.dtype}
    for device in ("cpu", "cuda", "hpu"):
        state[device] = (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
    return state


def lightning_module(model: nn.Module, seen: list[dict[str, Any]] | None = None) -> Any:
    """Wrap ``model`` in a LightningModule; ``seen`` collects the autocast state per step."""
    import lightning.pytorch as pl

    class Regression(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            x, y = batch
            out = self.model(x)
            if seen is not None:
                seen.append(autocast_state(out))
            return nn.functional.mse_loss(out.float(), y)

        def validation_step(self, batch: Any, index: int) -> None:
            self.model(batch[0])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=LR)

    return Regression()


def parameter_devices(devices: list[torch.device]) -> Any:
    """A Lightning callback that appends the module's parameter devices after every batch."""
    import lightning.pytorch as pl

    class ParameterDevices(pl.Callback):
        def on_train_batch_end(
            self, trainer: pl.Trainer, module: pl.LightningModule, *_: object
        ) -> None:
            devices.extend(parameter.device for parameter in module.parameters())

    return ParameterDevices()


def fit(
    trainer_kwargs: dict[str, Any],
    module: Any,
    data: list[tuple[torch.Tensor, torch.Tensor]],
    *,
    validate: bool = False,
) -> Any:
    """Fit ``module`` one epoch over ``data`` (one batch per step); return the Trainer."""
    import lightning.pytorch as pl

    loader = torch.utils.data.DataLoader(data, batch_size=None)
    with framework_warnings():
        trainer = pl.Trainer(
            **trainer_kwargs,
            max_epochs=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            limit_val_batches=2 if validate else 0,
            use_distributed_sampler=False,
        )
        trainer.fit(module, loader, loader if validate else None)
    return trainer


def fabric_sgd(
    fabric_arguments: dict[str, Any],
    model: nn.Module,
    data: list[tuple[torch.Tensor, torch.Tensor]],
    *,
    seen: list[dict[str, Any]] | None = None,
    note: Callable[[str], None] | None = None,
) -> Any:
    """Train ``model`` with SGD in a hand-written Fabric loop over ``data``; return Fabric.

    ``seen`` collects the autocast state inside each forward; ``note("backward")`` and
    ``note("step")`` run after each ``fabric.backward`` and each optimizer step.
    """
    from lightning.fabric import Fabric

    with framework_warnings():
        fabric = Fabric(**fabric_arguments)
        fabric.launch()
        if seen is not None:
            model.register_forward_hook(lambda module, args, out: seen.append(autocast_state(out)))
        module, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=LR))
        for batch in data:
            x, y = fabric.to_device(batch)
            optimizer.zero_grad()
            fabric.backward(nn.functional.mse_loss(module(x).float(), y))
            if note is not None:
                note("backward")
            optimizer.step()
            if note is not None:
                note("step")
    return fabric


# ZeRO configurations the tests run: stage, and the offload sections (ZeRO-3 only).
ZERO_CONFIGS: dict[str, dict[str, Any]] = {
    "zero1": {"stage": 1},
    "zero2": {"stage": 2},
    "zero3": {"stage": 3},
    "zero3_offload": {
        "stage": 3,
        "offload_optimizer": {"device": "cpu"},
        "offload_param": {"device": "cpu"},
    },
}


def deepspeed_sgd(
    model: nn.Module, data: list[tuple[torch.Tensor, torch.Tensor]], zero: dict[str, Any]
) -> dict[str, Any]:
    """Train ``model`` with DeepSpeed ZeRO (``zero`` is the config's ``zero_optimization``).

    The optimizer is torch's SGD; with an offloaded optimizer DeepSpeed would insist on
    its own CPU Adam unless ``zero_force_ds_cpu_optimizer`` is false. Returns copies of the
    trained parameters (``"parameters"``), gathered from their ZeRO-3 partitions, and what
    the engine ran: ``"stage"``, ``"offload"`` (optimizer, parameters).
    """
    import deepspeed

    world = int(os.environ.get("WORLD_SIZE", "1"))
    config = {
        "train_micro_batch_size_per_gpu": BATCH // world,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,  # DeepSpeed clips at 1.0 unless told otherwise
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
    }
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    for x, y in data:
        loss = nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
    parameters = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(parameters):  # a no-op below stage 3
        gathered = [p.detach().clone() for p in parameters]
    return {
        "parameters": gathered,
        "stage": engine.zero_optimization_stage(),
        "offload": (bool(engine.zero_offload_optimizer()), bool(engine.zero_offload_param())),
    }


def single_process_env() -> dict[str, str]:
    """The environment DeepSpeed's init_distributed needs to run alone (rank 0 of 1)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
