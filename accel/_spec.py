"""Records a plugin hands to accel: what a backend is called and how to make it."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from ._protocol import Accelerator

__all__ = ["Availability", "BackendSpec"]

_NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class Availability:
    """Whether a backend can run here, as found without initialising a device.

    Attributes:
        available: ``True`` when :func:`accel.get_backend` would succeed for it.
        reason: Why not, as a sentence, when ``available`` is false; why auto-detection
            passes it over, when ``automatic`` is false.
        device_count: Devices this process can see (0 when unavailable).
        automatic: ``False`` for a backend that can run here but that auto-detection
            must not pick, only a name (``ACCEL``, ``get_backend(name)``): PyTorch/XLA's
            CPU client runs on any host, yet such a host keeps ``cpu``.
    """

    available: bool
    reason: str | None = None
    device_count: int = 0
    automatic: bool = True

    @classmethod
    def unavailable(cls, reason: str) -> Availability:
        """Return an :class:`Availability` saying the backend cannot run, and why."""
        return cls(available=False, reason=reason, device_count=0)

    @classmethod
    def by_name_only(cls, reason: str, device_count: int = 1) -> Availability:
        """Return an :class:`Availability` for a backend only a name may select, and why."""
        return cls(available=True, reason=reason, device_count=device_count, automatic=False)


@dataclass(frozen=True)
class BackendSpec:
    """One backend a plugin provides through the ``accel_backends`` hook.

    Attributes:
        name: Lowercase identifier users select with ``ACCEL=<name>``.
        factory: Builds the :class:`accel.Accelerator`. Called once, only when the
            backend is selected; it may import vendor libraries.
        probe: Says whether the backend can run here. Called by auto-detection and
            ``python -m accel``; it must not initialise a device nor import a vendor
            library that patches torch, and must not raise.
        description: One line shown by ``python -m accel``.
        priority: Auto-detection order, highest first. Accelerators use positive
            values (built-ins: hpu 300, xla 250, the PrivateUse1 device 225, cuda 200,
            xpu 150, mps 100); ``cpu`` is 0 and is the fallback. Backends that must only
            be chosen by name use a negative value.
        named_probe: Optional. Replaces ``probe`` when the user names the backend
            (``get_backend(name)`` or ``ACCEL``), so it may ask the vendor library
            itself, importing it (what the user asked for); auto-detection and
            ``python -m accel`` keep using ``probe``. It must not raise either.
        binds_device_at_creation: Creating the backend binds this process to one
            device chosen from ``LOCAL_RANK`` (Habana's bridge takes its card when it is
            imported), so the device cannot be chosen later with ``set_device``. accel
            records ``LOCAL_RANK`` when it creates such a backend, and
            :func:`accel.distributed.init_process_group` refuses a local rank other
            than that one, before creating the backend where it can.
        device_type: Optional. The ``torch.device`` type the backend computes on, where
            the plugin knows it without creating the backend. A plugin for a device that
            joins torch through PrivateUse1 sets it (or uses the device's name as its
            own): accel's generic backend for that device then leaves auto-detection
            to the plugin.
    """

    name: str
    factory: Callable[[], Accelerator]
    probe: Callable[[], Availability]
    description: str = ""
    priority: int = field(default=-1)
    named_probe: Callable[[], Availability] | None = None
    binds_device_at_creation: bool = False
    device_type: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME_PATTERN.match(self.name):
            raise ValueError(
                f"Backend name {self.name!r} is invalid: names are lowercase letters, "
                "digits and underscores, starting with a letter (for example 'my_npu')."
            )
        for attribute in ("factory", "probe"):
            if not callable(getattr(self, attribute)):
                raise TypeError(
                    f"BackendSpec {self.name!r}: {attribute} must be callable, "
                    f"got {type(getattr(self, attribute)).__name__}."
                )
        if not isinstance(self.binds_device_at_creation, bool):
            raise TypeError(
                f"BackendSpec {self.name!r}: binds_device_at_creation must be a bool, "
                f"got {type(self.binds_device_at_creation).__name__}."
            )
        if self.device_type is not None and not isinstance(self.device_type, str):
            raise TypeError(
                f"BackendSpec {self.name!r}: device_type must be a str such as 'npu' or "
                f"None, got {type(self.device_type).__name__}."
            )
        if self.named_probe is not None and not callable(self.named_probe):
            raise TypeError(
                f"BackendSpec {self.name!r}: named_probe must be callable or None, "
                f"got {type(self.named_probe).__name__}."
            )
