"""``AccelFabricAccelerator``: Fabric's ``Accelerator`` for any accel backend."""

from __future__ import annotations

from typing import ClassVar

from ..._protocol import Accelerator
from ._bound import BoundAccelerator
from ._mapping import Front

__all__ = ["AccelFabricAccelerator"]


class AccelFabricAccelerator(BoundAccelerator):
    """Fabric's ``Accelerator`` for an accel backend.

    ``Fabric(accelerator=AccelFabricAccelerator("hpu"), strategy=...)``, or
    ``Fabric(accelerator="accel")`` (registered in Fabric's registry on import; the
    backend is :func:`accel.get_backend`'s: ``ACCEL``, then detection). Devices, their
    count and availability come from the backend, as for the Trainer's
    :class:`AccelAccelerator`. Pair it with accel's Fabric strategies
    (:func:`fabric_kwargs` does, or ``strategy="accel_single_device"`` /
    ``"accel_ddp"``): Fabric's own give an accelerator they do not know a CPU device,
    CUDA streams for DDP and no ``mark_step``, which :meth:`setup_device` refuses on a
    backend that is not the host CPU or is lazy.

    Args:
        backend: A backend name, a backend object, or ``None`` for ``accel.get_backend()``.

    Raises:
        accel.AccelTypeError, accel.BackendNotFoundError, accel.BackendUnavailableError:
            ``backend`` is not a backend, names none, or names one unusable here.
    """

    _front: ClassVar[Front] = "Fabric"

    def __new__(cls, backend: str | Accelerator | None = None) -> AccelFabricAccelerator:
        instance: AccelFabricAccelerator = super().__new__(cls, backend)
        return instance
