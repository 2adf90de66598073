"""``trainer_kwargs`` and ``fabric_kwargs``: everything a front end needs, from one backend."""

from __future__ import annotations

from typing import Any

from ..._protocol import Accelerator
from ..._resolve import resolve_backend
from ._accelerator import AccelAccelerator
from ._fabric_accelerator import AccelFabricAccelerator
from ._fabric_precision import fabric_precision_plugin
from ._fabric_strategies import AccelFabricDDPStrategy, AccelFabricSingleDeviceStrategy
from ._mapping import BackendMapping, Front
from ._precision import precision_plugin
from ._strategies import AccelDDPStrategy, AccelSingleDeviceStrategy

__all__ = ["fabric_kwargs", "trainer_kwargs"]

_SUBSYSTEM = "accel.integrations.lightning"


def _front_kwargs(
    front: Front, backend: str | Accelerator | None, devices: Any, precision: Any
) -> dict[str, Any]:
    """The accelerator, strategy, devices and precision plugin of ``front`` for ``backend``."""
    resolved = resolve_backend(backend, _SUBSYSTEM)
    trainer = front == "Trainer"
    single, device = BackendMapping(resolved, front).single_device(devices)
    plugin = (precision_plugin if trainer else fabric_precision_plugin)(resolved, precision)
    strategy: Any
    if single:
        single_class = AccelSingleDeviceStrategy if trainer else AccelFabricSingleDeviceStrategy
        strategy = single_class(resolved, device=device)
        strategy.device_was_given = False  # the backend's own device, by index
    else:
        strategy = (AccelDDPStrategy if trainer else AccelFabricDDPStrategy)(resolved)
    accelerator = (AccelAccelerator if trainer else AccelFabricAccelerator)(resolved)
    return {
        "accelerator": accelerator,
        "strategy": strategy,
        "devices": devices,
        "plugins": [plugin],
    }


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
    Trainer as well. Fabric's counterpart is :func:`fabric_kwargs`.

    Args:
        backend: A backend name, a backend object, or ``None`` for ``accel.get_backend()``.
        devices: Processes (an int, ``-1`` for every device) or device indices, as
            Lightning takes them.
        precision: ``"32-true"``, ``"bf16-mixed"`` or ``"16-mixed"``.

    Raises:
        LightningSetupError: ``devices`` or ``precision`` the backend cannot run.
    """
    return _front_kwargs("Trainer", backend, devices, precision)


def fabric_kwargs(
    backend: str | Accelerator | None = None,
    *,
    devices: int | str | list[int] = 1,
    precision: str | int = "32-true",
) -> dict[str, Any]:
    """Return the ``Fabric`` arguments that run on ``backend``: :func:`trainer_kwargs` for Fabric.

    ``Fabric(**fabric_kwargs())``: ``accelerator`` (an :class:`AccelFabricAccelerator`),
    ``strategy`` (:class:`AccelFabricSingleDeviceStrategy` for one process,
    :class:`AccelFabricDDPStrategy` for several), ``devices``, and ``plugins`` (from
    :func:`fabric_precision_plugin`); do not pass ``precision=`` to Fabric as well.
    Arguments and errors are :func:`trainer_kwargs`'s.

    Args:
        backend: A backend name, a backend object, or ``None`` for ``accel.get_backend()``.
        devices: As for :func:`trainer_kwargs`.
        precision: As for :func:`trainer_kwargs`.

    Raises:
        LightningSetupError: See :func:`trainer_kwargs`.
    """
    return _front_kwargs("Fabric", backend, devices, precision)
