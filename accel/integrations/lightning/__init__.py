"""Lightning on any accel backend: one accelerator, two strategies, one precision plugin.

Example::

    import lightning.pytorch as pl
    from accel.integrations.lightning import trainer_kwargs

    trainer = pl.Trainer(**trainer_kwargs(precision="bf16-mixed"), max_epochs=3)
    trainer.fit(model, loader)

Importing this module registers ``accelerator="accel"`` (the backend
:func:`accel.get_backend` picks: ``ACCEL``, then detection) and the strategies
``"accel_single_device"`` and ``"accel_ddp"`` with Lightning, so
``Trainer(accelerator="accel", strategy="accel_single_device")`` works too; with a
backend that is the host CPU and eager, Lightning's own strategies also do. Mixed
precision chosen by name (``precision="bf16-mixed"``) is moved to the backend's device
type when training starts. Needs ``pip install 'accel-hal[lightning]'`` (Lightning 2.6).
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.accelerators import AcceleratorRegistry
from lightning.pytorch.strategies import StrategyRegistry

from ..._protocol import Accelerator
from .._backend import resolve_backend
from ._accelerator import AccelAccelerator, LightningSetupError
from ._precision import PRECISIONS, precision_plugin
from ._strategies import AccelDDPStrategy, AccelSingleDeviceStrategy

__all__ = [
    "AccelAccelerator",
    "AccelDDPStrategy",
    "AccelSingleDeviceStrategy",
    "LightningSetupError",
    "PRECISIONS",
    "precision_plugin",
    "register",
    "trainer_kwargs",
]


def trainer_kwargs(
    backend: str | Accelerator | None = None,
    *,
    devices: int | str | list[int] = 1,
    precision: str | int = "32-true",
) -> dict[str, Any]:
    """Return the ``Trainer`` arguments that run on ``backend``.

    ``Trainer(**trainer_kwargs(), max_epochs=...)``: ``accelerator`` (an
    :class:`AccelAccelerator`), ``strategy`` (:class:`AccelSingleDeviceStrategy` for one
    process, :class:`AccelDDPStrategy` for several), ``devices``, and ``plugins`` (the
    precision plugin from :func:`precision_plugin`). Do not pass ``precision=`` to the
    Trainer as well.

    Args:
        backend: A backend name, a backend object, or ``None`` for ``accel.get_backend()``.
        devices: Processes (an int, ``-1`` for every device) or device indices, as
            Lightning takes them.
        precision: ``"32-true"``, ``"bf16-mixed"`` or ``"16-mixed"``.

    Raises:
        LightningSetupError: ``devices`` or ``precision`` the backend cannot run.
    """
    resolved = resolve_backend(backend, "accel.integrations.lightning")
    accelerator = AccelAccelerator(resolved)
    parsed = accelerator.parse_devices(devices)
    plugin = precision_plugin(resolved, precision)
    strategy: AccelSingleDeviceStrategy | AccelDDPStrategy
    if isinstance(parsed, list) and len(parsed) == 1:
        strategy = AccelSingleDeviceStrategy(resolved, device=resolved.device(parsed[0]))
        strategy.device_was_given = False  # the backend's own device, by index
    elif parsed == 1:
        strategy = AccelSingleDeviceStrategy(resolved)
    else:
        strategy = AccelDDPStrategy(resolved)
    return {
        "accelerator": accelerator,
        "strategy": strategy,
        "devices": devices,
        "plugins": [plugin],
    }


def register() -> None:
    """Register ``"accel"``, ``"accel_single_device"`` and ``"accel_ddp"`` with Lightning.

    Runs on import; names already registered (by an earlier import) are left alone.
    """
    if "accel" not in AcceleratorRegistry:
        AcceleratorRegistry.register(
            "accel", AccelAccelerator, description="accel's backend (accel.get_backend())"
        )
    for strategy in (AccelSingleDeviceStrategy, AccelDDPStrategy):
        if strategy.strategy_name not in StrategyRegistry:
            StrategyRegistry.register(
                strategy.strategy_name, strategy, description=strategy.__doc__ or ""
            )


register()
