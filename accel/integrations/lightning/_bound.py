"""Lightning accelerators and strategies bound to one accel backend, for Trainer and Fabric.

Lightning calls ``is_available``, ``parse_devices`` and ``get_parallel_devices`` on the
accelerator's *class* (the Trainer's ``_AcceleratorConnector`` and Fabric's
``_Connector`` alike), so a class-level answer must know the backend. Each backend
therefore gets its own subclass, made once and cached: ``AccelAccelerator("cpu")`` is an
instance of ``AccelAccelerator[cpu]``, whose class methods answer for ``cpu`` (a
subclass ``MyAccelerator("cpu")`` likewise gets ``MyAccelerator[cpu]``). The answers
themselves come from :class:`~._mapping.BackendMapping`.

The strategy side: :class:`OnBackend` (the backend, its mapping, claiming the
accelerator) and the constructors and setups both front ends' single-device and DDP
strategies share (:class:`SingleDeviceOnBackend`, :class:`DDPOnBackend`); the front
ends add only their own step hooks.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from lightning.fabric.accelerators.accelerator import Accelerator as FabricAccelerator

from ..._errors import AccelError
from ..._protocol import Accelerator
from ..._resolve import resolve_backend
from ._mapping import BackendMapping, Front, lightning_error

__all__: list[str] = []

_SUBSYSTEM = "accel.integrations.lightning"
_bound_classes: dict[tuple[type, int], tuple[Accelerator, type]] = {}


class BoundAccelerator(FabricAccelerator):
    """Lightning's accelerator interface answered for the backend the class is bound to.

    The Trainer's :class:`AccelAccelerator` and Fabric's :class:`AccelFabricAccelerator`
    both derive from it (Lightning's Trainer accelerator is a Fabric accelerator).
    """

    _bound_backend: ClassVar[Accelerator | None] = None
    _front: ClassVar[Front] = "Trainer"
    # The accel strategy that set this accelerator up (see setup_device).
    _accel_strategy: object | None = None

    def __new__(cls, backend: str | Accelerator | None = None) -> Any:
        if backend is None and cls._bound_backend is not None:
            bound = cls  # a per-backend class: keep its backend
        else:
            root = cls if cls._bound_backend is None else cls.__bases__[0]
            bound = _bound_class(root, resolve_backend(backend, _SUBSYSTEM))
        return super().__new__(bound)

    def __init__(self, backend: str | Accelerator | None = None) -> None:
        super().__init__()  # the backend lives on the class __new__ chose

    @property
    def backend(self) -> Accelerator:
        """The accel backend this accelerator runs on."""
        bound = type(self)._bound_backend
        assert bound is not None  # every instance is of a per-backend class
        return bound

    @property
    def mapping(self) -> BackendMapping:
        """What the backend means for Lightning (devices, precision, step boundaries)."""
        return BackendMapping(self.backend, self._front)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # The per-backend class is not importable by name: rebuild from the backend.
        root = type(self) if type(self)._bound_backend is None else type(self).__bases__[0]
        return (root, (self.backend.name,))

    @classmethod
    def _class_mapping(cls) -> BackendMapping:
        backend = cls._bound_backend
        if backend is None:
            backend = resolve_backend(None, _SUBSYSTEM)
        return BackendMapping(backend, cls._front)

    # Lightning's abstract members ------------------------------------------------------

    def setup_device(self, device: torch.device) -> None:
        """Make ``device`` current on the backend (``backend.set_device``).

        Raises:
            LightningSetupError: ``device`` is of another type than the backend's and no
                accel strategy chose it, or the backend is not the host CPU or is lazy
                and the strategy is Lightning's own (see the class docstring).
        """
        self.mapping.setup_device(device, self._accel_strategy)

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
        return cls._class_mapping().parse_devices(devices)

    @classmethod
    def get_parallel_devices(cls, devices: Any) -> list[torch.device]:  # type: ignore[override]
        """Return one ``torch.device`` per process, by accel's device rule.

        ``n`` processes on a backend with one device per process (the host CPU, Gaudi)
        all get ``device(0)``; on a backend with several, process ``r`` gets index ``r``
        (as :func:`accel.distributed.init_process_group` binds them).
        """
        return cls._class_mapping().parallel_devices(devices)

    @classmethod
    def auto_device_count(cls) -> int:  # type: ignore[override]
        """Return ``backend.device_count()`` (at least 1: the host always runs one process)."""
        return cls._class_mapping().auto_device_count()

    @classmethod
    def is_available(cls) -> bool:  # type: ignore[override]
        """Return ``backend.is_available()``; ``False`` where no backend can be created."""
        try:
            return cls._class_mapping().backend.is_available()
        except AccelError:
            return False

    @staticmethod
    def name() -> str:
        """Return ``"accel"``, the name registered with Lightning."""
        return "accel"

    def __repr__(self) -> str:
        root = type(self) if type(self)._bound_backend is None else type(self).__bases__[0]
        return f"{root.__name__}(backend={self.backend.name!r})"


def _bound_class(root: type, backend: Accelerator) -> type:
    """Return the cached subclass of ``root`` answering for ``backend``."""
    key = (root, id(backend))
    known = _bound_classes.get(key)
    if known is not None and known[0] is backend:
        return known[1]
    bound = type(
        f"{root.__name__}[{backend.name}]",
        (root,),
        {"_bound_backend": backend, "__module__": root.__module__},
    )
    _bound_classes[key] = (backend, bound)
    return bound


class OnBackend:
    """What an accel strategy of either front end knows: its backend and what it means."""

    _accel_backend: Accelerator
    _front: ClassVar[Front] = "Trainer"
    device_was_given = False

    def _bind(
        self, backend: str | Accelerator | None, device: torch.device | str | None = None
    ) -> torch.device:
        """Run on ``backend``; return the device to train on (``device``, else the backend's)."""
        self._accel_backend = resolve_backend(backend, _SUBSYSTEM)
        self.device_was_given = device is not None
        return self._accel_backend.device() if device is None else torch.device(device)

    @property
    def backend(self) -> Accelerator:
        """The accel backend this strategy runs on."""
        return self._accel_backend

    @property
    def mapping(self) -> BackendMapping:
        """What the backend means for Lightning (devices, precision, step boundaries)."""
        return BackendMapping(self._accel_backend, self._front)

    def _claim_accelerator(self) -> None:
        """Tie the strategy's accelerator (an accel one) to this strategy."""
        claim_accelerator(self, getattr(self, "accelerator", None), self._accel_backend)


class SingleDeviceOnBackend(OnBackend):
    """The constructor and setup of both front ends' single-device strategies."""

    def __init__(
        self,
        backend: str | Accelerator | None = None,
        device: torch.device | str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(device=self._bind(backend, device), **kwargs)  # type: ignore[call-arg]

    def setup_environment(self) -> None:
        """Tie the accelerator to this strategy, then set the device up."""
        self._claim_accelerator()
        super().setup_environment()  # type: ignore[misc]


class DDPOnBackend(OnBackend):
    """The constructor and setup of both front ends' DDP strategies."""

    def __init__(self, backend: str | Accelerator | None = None, **kwargs: Any) -> None:
        self._bind(backend)
        kwargs.setdefault("process_group_backend", self.mapping.process_group_backend)
        super().__init__(**kwargs)

    def setup_environment(self) -> None:
        """Tie the accelerator to this strategy, prepare the backend, then set up DDP."""
        self._claim_accelerator()
        self._accel_backend.prepare_distributed()
        super().setup_environment()  # type: ignore[misc]


def claim_accelerator(strategy: object, accelerator: object, backend: Accelerator) -> None:
    """Tie an accel ``accelerator`` to the accel ``strategy`` running it on ``backend``.

    An accelerator of Lightning's own is left alone (the strategy then keeps its device).

    Raises:
        LightningSetupError: The accelerator runs on another backend than the strategy.
    """
    if not isinstance(accelerator, BoundAccelerator):
        return
    if accelerator.backend is not backend:
        kwargs = "trainer_kwargs" if accelerator._front == "Trainer" else "fabric_kwargs"
        raise lightning_error(
            f"the strategy runs on the {backend.name} backend but the accelerator on "
            f"{accelerator.backend.name}. Give both the same backend ({kwargs}(backend) does)."
        )
    accelerator._accel_strategy = strategy
