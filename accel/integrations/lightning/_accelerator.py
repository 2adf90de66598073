"""``AccelAccelerator``: Lightning's ``Accelerator`` for any accel backend.

Lightning calls ``is_available``, ``parse_devices`` and ``get_parallel_devices`` on the
accelerator's *class* (``_AcceleratorConnector``), so a class-level answer must know the
backend. Each backend therefore gets its own subclass, made once and cached:
``AccelAccelerator("cpu")`` is an instance of ``AccelAccelerator[cpu]``, whose class
methods answer for ``cpu`` (a subclass ``MyAccelerator("cpu")`` likewise gets
``MyAccelerator[cpu]``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from lightning.pytorch.accelerators import Accelerator as LightningAccelerator
from lightning.pytorch.plugins.precision import MixedPrecision

from ..._errors import AccelError
from ..._protocol import Accelerator
from .._backend import resolve_backend

if TYPE_CHECKING:
    import lightning.pytorch as pl

__all__ = ["AccelAccelerator", "LightningSetupError"]

_STRATEGY_HINT = (
    "Build the Trainer with Trainer(**accel.integrations.lightning.trainer_kwargs(...)), or "
    "pass strategy='accel_single_device' (one device) or strategy='accel_ddp' (several)."
)


class LightningSetupError(AccelError, ValueError):
    """Lightning was configured in a way that would run the backend wrongly."""


def lightning_error(message: str) -> LightningSetupError:
    """Return a :class:`LightningSetupError` with the subsystem prefix."""
    return LightningSetupError(f"accel.integrations.lightning: {message}")


class AccelAccelerator(LightningAccelerator):
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

    _bound_backend: ClassVar[Accelerator | None] = None
    _bound_classes: ClassVar[
        dict[tuple[type[AccelAccelerator], int], tuple[Accelerator, type[AccelAccelerator]]]
    ] = {}

    def __new__(cls, backend: str | Accelerator | None = None) -> AccelAccelerator:
        if backend is None and cls._bound_backend is not None:
            bound = cls  # a per-backend class: keep its backend
        else:
            root = cls if cls._bound_backend is None else cls.__bases__[0]
            resolved = resolve_backend(backend, "accel.integrations.lightning")
            bound = _bound_class(root, resolved)
        instance: AccelAccelerator = super().__new__(bound)
        return instance

    # The accel strategy that set this accelerator up (see setup_device).
    _accel_strategy: object | None = None

    def __init__(self, backend: str | Accelerator | None = None) -> None:
        super().__init__()  # the backend lives on the class __new__ chose

    @property
    def backend(self) -> Accelerator:
        """The accel backend this accelerator runs on."""
        bound = type(self)._bound_backend
        assert bound is not None  # every instance is of a per-backend class
        return bound

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # The per-backend class is not importable by name: rebuild from the backend.
        return (AccelAccelerator, (self.backend.name,))

    @classmethod
    def _class_backend(cls) -> Accelerator:
        if cls._bound_backend is not None:
            return cls._bound_backend
        return resolve_backend(None, "accel.integrations.lightning")

    # Lightning's abstract members ------------------------------------------------------

    def setup_device(self, device: torch.device) -> None:
        """Make ``device`` current on the backend (``backend.set_device``).

        Raises:
            LightningSetupError: ``device`` is of another type than the backend's and no
                accel strategy chose it, or the backend is not the host CPU or is lazy
                and the strategy is Lightning's own (see the class docstring).
        """
        backend = self.backend
        own = self._accel_strategy is not None
        if device.type != backend.device_type:
            if own and getattr(self._accel_strategy, "device_was_given", False):
                return  # the user put this strategy's model on another device on purpose
            raise lightning_error(
                f"Lightning chose device {device} but the {backend.name} backend computes on "
                f"{backend.device_type!r} devices: Lightning 2.6 gives an accelerator it does "
                f"not know a CPU single-device strategy. {_STRATEGY_HINT}"
            )
        if not own and (backend.device_type != "cpu" or backend.is_lazy):
            raise lightning_error(
                f"the {backend.name} backend runs under a strategy of Lightning's own, which "
                "creates CUDA streams for DDP and never calls mark_step (lazy devices need "
                f"it at each step). {_STRATEGY_HINT}"
            )
        backend.set_device(0 if device.index is None else device.index)

    def setup(self, trainer: pl.Trainer) -> None:
        """Make Lightning's mixed precision autocast on the backend's device type.

        Lightning builds ``MixedPrecision(device="cuda")`` for every accelerator it does
        not know; this replaces it with the same precision on ``backend.device_type``.
        """
        plugin = trainer.strategy.precision_plugin
        if type(plugin) is MixedPrecision and plugin.device != self.backend.device_type:
            from ._precision import precision_plugin

            trainer.strategy.precision_plugin = precision_plugin(self.backend, plugin.precision)

    def teardown(self) -> None:
        """Nothing to release: the backend lives as long as the process."""

    @classmethod
    def parse_devices(cls, devices: Any) -> int | list[int]:  # type: ignore[override]
        """Return ``devices`` as a process count (``int``) or a list of device indices.

        Accepts a positive int, ``-1`` (every device), a digit string (``"2"``, ``"-1"``),
        a comma-separated string of indices (``"0,1"``) or a list of indices.

        Raises:
            LightningSetupError: Anything else, or an index the backend does not have.
        """
        backend = cls._class_backend()
        if isinstance(devices, str):
            text = devices.strip()
            if "," in text or text.startswith("["):
                devices = [part for part in text.strip("[]").split(",") if part.strip()]
            elif text.lstrip("-").isdigit():
                devices = int(text)
        if isinstance(devices, int) and not isinstance(devices, bool):
            if devices == -1:
                return max(1, backend.device_count())
            if devices >= 1:
                return devices
        elif isinstance(devices, (list, tuple)) and devices:
            try:
                indices = [int(str(index).strip()) for index in devices]
            except ValueError:
                indices = []
            count = backend.device_count()
            if indices and all(0 <= index < max(count, 1) for index in indices):
                return indices
        raise lightning_error(
            f"devices={devices!r} is not a device selection for the {backend.name} backend "
            f"({backend.device_count()} device(s) in this process). Pass a positive number "
            "of processes, -1 for every device, or a list of device indices."
        )

    @classmethod
    def get_parallel_devices(cls, devices: Any) -> list[torch.device]:  # type: ignore[override]
        """Return one ``torch.device`` per process, by accel's device rule.

        ``n`` processes on a backend with one device per process (the host CPU, Gaudi)
        all get ``device(0)``; on a backend with several, process ``r`` gets index ``r``
        (as :func:`accel.distributed.init_process_group` binds them).
        """
        backend = cls._class_backend()
        parsed = cls.parse_devices(devices)
        if isinstance(parsed, list):
            return [backend.device(index) for index in parsed]
        count = backend.device_count()
        if count <= 1:
            return [backend.device(0)] * parsed
        if parsed > count:
            raise lightning_error(
                f"devices={devices!r} asks for {parsed} processes but the {backend.name} "
                f"backend has {count} devices here. Pass devices={count} or fewer."
            )
        return [backend.device(index) for index in range(parsed)]

    @classmethod
    def auto_device_count(cls) -> int:  # type: ignore[override]
        """Return ``backend.device_count()`` (at least 1: the host always runs one process)."""
        return max(1, cls._class_backend().device_count())

    @classmethod
    def is_available(cls) -> bool:  # type: ignore[override]
        """Return ``backend.is_available()``; ``False`` where no backend can be created."""
        try:
            return cls._class_backend().is_available()
        except AccelError:
            return False

    @staticmethod
    def name() -> str:
        """Return ``"accel"``, the name registered with Lightning."""
        return "accel"

    def get_device_stats(self, device: Any) -> dict[str, Any]:
        """Return the backend's memory figures (empty where it has no memory statistics)."""
        backend = self.backend
        if not backend.supports_memory_stats:
            return {}
        return {
            "memory_allocated": backend.memory_allocated(),
            "max_memory_allocated": backend.max_memory_allocated(),
        }

    def __repr__(self) -> str:
        return f"AccelAccelerator(backend={self.backend.name!r})"


def _bound_class(root: type[AccelAccelerator], backend: Accelerator) -> type[AccelAccelerator]:
    """Return the cached subclass of ``root`` answering for ``backend``."""
    key = (root, id(backend))
    known = AccelAccelerator._bound_classes.get(key)
    if known is not None and known[0] is backend:
        return known[1]
    bound = type(
        f"{root.__name__}[{backend.name}]",
        (root,),
        {"_bound_backend": backend, "__module__": root.__module__},
    )
    AccelAccelerator._bound_classes[key] = (backend, bound)
    return bound
