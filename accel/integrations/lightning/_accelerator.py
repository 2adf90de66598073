"""``AccelAccelerator``: the Trainer's ``Accelerator`` for any accel backend.

Each backend gets its own subclass (see :mod:`._bound`); the answers come from
:class:`~._mapping.BackendMapping`, shared with Fabric's accelerator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning.pytorch.accelerators import Accelerator as LightningAccelerator
from lightning.pytorch.plugins.precision import MixedPrecision

from ..._protocol import Accelerator
from ._bound import BoundAccelerator

if TYPE_CHECKING:
    import lightning.pytorch as pl

__all__ = ["AccelAccelerator"]


class AccelAccelerator(BoundAccelerator, LightningAccelerator):
    """Lightning's ``Accelerator`` for an accel backend.

    ``Trainer(accelerator=AccelAccelerator("hpu"))``, or ``Trainer(accelerator="accel")``
    (registered on import; the backend is :func:`accel.get_backend`'s: ``ACCEL``, then
    detection). Devices, their count and availability come from the backend; device
    statistics from its memory members. Pair it with accel's strategies
    (:func:`trainer_kwargs` does): Lightning's own give unknown accelerators a CPU device
    and CUDA streams, which :meth:`setup_device` refuses on a non-host or lazy backend.

    Args:
        backend: A backend name, a backend object, or ``None`` for ``accel.get_backend()``.

    Raises:
        accel.AccelTypeError, accel.BackendNotFoundError, accel.BackendUnavailableError:
            ``backend`` is not a backend, names none, or names one unusable here.
    """

    def __new__(cls, backend: str | Accelerator | None = None) -> AccelAccelerator:
        instance: AccelAccelerator = super().__new__(cls, backend)
        return instance

    def setup(self, trainer: pl.Trainer) -> None:
        """Make Lightning's mixed precision autocast on the backend's device type.

        Lightning builds ``MixedPrecision(device="cuda")`` for every accelerator it does
        not know; this replaces it with the same precision on ``backend.device_type``.
        """
        plugin = trainer.strategy.precision_plugin
        if type(plugin) is MixedPrecision and plugin.device != self.mapping.autocast_device_type:
            from ._precision import precision_plugin

            trainer.strategy.precision_plugin = precision_plugin(self.backend, plugin.precision)

    def get_device_stats(self, device: Any) -> dict[str, Any]:
        """Return the backend's memory figures (empty where it has no memory statistics)."""
        return self.mapping.device_stats()
