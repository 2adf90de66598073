"""Lightning on any accel backend: the Trainer's and Fabric's accelerator, strategies, precision.

Trainer::

    import lightning.pytorch as pl
    from accel.integrations.lightning import trainer_kwargs

    trainer = pl.Trainer(**trainer_kwargs(precision="bf16-mixed"), max_epochs=3)
    trainer.fit(model, loader)

Fabric::

    from lightning.fabric import Fabric
    from accel.integrations.lightning import fabric_kwargs

    fabric = Fabric(**fabric_kwargs(precision="bf16-mixed"))
    model, optimizer = fabric.setup(model, optimizer)
    fabric.backward(loss)  # not loss.backward(): the step ends here on a lazy backend

Importing this module registers ``accelerator="accel"`` (the backend
:func:`accel.get_backend` picks: ``ACCEL``, then detection) and the strategies
``"accel_single_device"`` and ``"accel_ddp"`` with both the Trainer and Fabric, so
``Trainer(accelerator="accel", strategy="accel_single_device")`` and
``Fabric(accelerator="accel", strategy="accel_single_device")`` work too; with a
backend that is the host CPU and eager, Lightning's own strategies also do. The
Trainer's mixed precision chosen by name (``precision="bf16-mixed"``) is moved to the
backend's device type when training starts, Fabric's when an accel strategy receives
it. How a backend maps onto Lightning (devices, collectives, precision, step
boundaries) is decided in one place for both front ends. Needs
``pip install 'accel-hal[lightning]'`` (Lightning 2.6).
"""

from __future__ import annotations

from lightning.fabric.accelerators import ACCELERATOR_REGISTRY
from lightning.fabric.strategies import STRATEGY_REGISTRY
from lightning.pytorch.accelerators import AcceleratorRegistry
from lightning.pytorch.strategies import StrategyRegistry

from ._accelerator import AccelAccelerator
from ._fabric_accelerator import AccelFabricAccelerator
from ._fabric_precision import AccelFabricPrecision, fabric_precision_plugin
from ._fabric_strategies import AccelFabricDDPStrategy, AccelFabricSingleDeviceStrategy
from ._kwargs import fabric_kwargs, trainer_kwargs
from ._mapping import PRECISIONS, BackendMapping, LightningSetupError
from ._precision import precision_plugin
from ._strategies import AccelDDPStrategy, AccelSingleDeviceStrategy

__all__ = [
    "AccelAccelerator",
    "AccelDDPStrategy",
    "AccelFabricAccelerator",
    "AccelFabricDDPStrategy",
    "AccelFabricPrecision",
    "AccelFabricSingleDeviceStrategy",
    "AccelSingleDeviceStrategy",
    "BackendMapping",
    "LightningSetupError",
    "PRECISIONS",
    "fabric_kwargs",
    "fabric_precision_plugin",
    "precision_plugin",
    "register",
    "trainer_kwargs",
]


def register() -> None:
    """Register ``"accel"``, ``"accel_single_device"`` and ``"accel_ddp"`` with Lightning.

    Both the Trainer's registries and Fabric's get them (Fabric's with the Fabric
    classes). Runs on import; names already registered (by an earlier import) are left
    alone.
    """
    accelerators = (
        (AcceleratorRegistry, AccelAccelerator),
        (ACCELERATOR_REGISTRY, AccelFabricAccelerator),
    )
    for registry, accelerator in accelerators:
        if "accel" not in registry:
            registry.register(
                "accel", accelerator, description="accel's backend (accel.get_backend())"
            )
    strategies = (
        (StrategyRegistry, "accel_single_device", AccelSingleDeviceStrategy),
        (StrategyRegistry, "accel_ddp", AccelDDPStrategy),
        (STRATEGY_REGISTRY, "accel_single_device", AccelFabricSingleDeviceStrategy),
        (STRATEGY_REGISTRY, "accel_ddp", AccelFabricDDPStrategy),
    )
    for strategy_registry, name, strategy in strategies:
        if name not in strategy_registry:
            strategy_registry.register(name, strategy, description=strategy.__doc__ or "")


register()
