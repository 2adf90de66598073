"""How an accel backend maps onto Lightning: the one place both front ends ask.

Lightning has two front ends with classes of their own: the Trainer
(``lightning.pytorch``) and Fabric (``lightning.fabric``). Their accelerators,
strategies and precision plugins differ, but the answers about a backend do not:
which devices a ``devices=`` argument selects, which process-group backend DDP uses,
which precisions the backend computes in and where autocast runs, which strategy a
``*_kwargs()`` call builds, when Lightning's own strategies are refused, and where a
lazy backend's step ends. :class:`BackendMapping` gives those answers; the adapters of
both front ends only translate them into Lightning's calls. Nothing here imports
Lightning.
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from ..._errors import AccelError
from ..._protocol import Accelerator

__all__ = ["PRECISIONS", "BackendMapping", "LightningSetupError"]

Front = Literal["Trainer", "Fabric"]
Mixed = Literal["16-mixed", "bf16-mixed"]

PRECISIONS = ("32-true", "bf16-mixed", "16-mixed")
"""The precisions the adapters build plugins for (``32``, ``"bf16"`` and ``16`` are aliases)."""

_ALIASES: dict[Any, str] = {
    "32": "32-true",
    32: "32-true",
    "bf16": "bf16-mixed",
    "16": "16-mixed",
    16: "16-mixed",
}


class LightningSetupError(AccelError, ValueError):
    """Lightning was configured in a way that would run the backend wrongly."""


def lightning_error(message: str) -> LightningSetupError:
    """Return a :class:`LightningSetupError` with the subsystem prefix."""
    return LightningSetupError(f"accel.integrations.lightning: {message}")


def _strategy_hint(front: Front) -> str:
    kwargs = "trainer_kwargs" if front == "Trainer" else "fabric_kwargs"
    return (
        f"Build it with {front}(**accel.integrations.lightning.{kwargs}(...)), or pass "
        "strategy='accel_single_device' (one device) or strategy='accel_ddp' (several)."
    )


class BackendMapping:
    """The answers Lightning's Trainer and Fabric need about one accel backend.

    Args:
        backend: The accel backend.
        front: ``"Trainer"`` or ``"Fabric"``, for the advice in error messages.
    """

    def __init__(self, backend: Accelerator, front: Front) -> None:
        self.backend = backend
        self.front: Front = front

    # Devices -----------------------------------------------------------------------------

    def parse_devices(self, devices: Any) -> int | list[int]:
        """Return ``devices`` as a process count (``int``) or a list of device indices.

        Accepts a positive int, ``-1`` (every device), a digit string (``"2"``, ``"-1"``),
        a comma-separated string of indices (``"0,1"``) or a list of indices.

        Raises:
            LightningSetupError: Anything else, or an index the backend does not have.
        """
        backend, given = self.backend, devices
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
            f"devices={given!r} is not a device selection for the {backend.name} backend "
            f"({backend.device_count()} device(s) in this process). Pass a positive number "
            "of processes, -1 for every device, or a list of device indices."
        )

    def parallel_devices(self, devices: Any) -> list[torch.device]:
        """Return one ``torch.device`` per process, by accel's device rule.

        ``n`` processes on a backend with one device per process (the host CPU, Gaudi)
        all get ``device(0)``; on a backend with several, process ``r`` gets index ``r``
        (as :func:`accel.distributed.init_process_group` binds them).
        """
        backend = self.backend
        parsed = self.parse_devices(devices)
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

    def auto_device_count(self) -> int:
        """Return ``backend.device_count()``, at least 1 (the host always runs one process)."""
        return max(1, self.backend.device_count())

    def device_stats(self) -> dict[str, Any]:
        """Return the backend's memory figures (empty where it has no memory statistics)."""
        backend = self.backend
        if not backend.supports_memory_stats:
            return {}
        return {
            "memory_allocated": backend.memory_allocated(),
            "max_memory_allocated": backend.max_memory_allocated(),
        }

    def setup_device(self, device: torch.device, strategy: object | None) -> None:
        """Make ``device`` current on the backend, or refuse a setup that runs it wrongly.

        Args:
            device: The strategy's root device.
            strategy: The accel strategy that claimed the accelerator, or ``None`` under
                a strategy of Lightning's own.

        Raises:
            LightningSetupError: ``device`` is of another type than the backend's and no
                accel strategy was given it on purpose, or the backend is not the host CPU
                or is lazy and the strategy is Lightning's own (which creates CUDA streams
                for DDP and never calls ``mark_step``).
        """
        backend = self.backend
        if device.type != backend.device_type:
            if strategy is not None and getattr(strategy, "device_was_given", False):
                return  # the user put this strategy's model on another device on purpose
            raise lightning_error(
                f"Lightning chose device {device} but the {backend.name} backend computes on "
                f"{backend.device_type!r} devices: Lightning 2.6 gives an accelerator it does "
                f"not know a CPU single-device strategy. {_strategy_hint(self.front)}"
            )
        if strategy is None and not self.runs_under_lightnings_strategies:
            raise lightning_error(
                f"the {backend.name} backend runs under a strategy of Lightning's own, which "
                "creates CUDA streams for DDP and never calls mark_step (lazy devices need "
                f"it at each step). {_strategy_hint(self.front)}"
            )
        backend.set_device(0 if device.index is None else device.index)

    @property
    def runs_under_lightnings_strategies(self) -> bool:
        """Whether Lightning's own strategies run this backend right (an eager host CPU)."""
        return self.backend.device_type == "cpu" and not self.backend.is_lazy

    # Strategies --------------------------------------------------------------------------

    def single_device(self, devices: Any) -> tuple[bool, torch.device | None]:
        """Return whether ``devices`` means one process, and the device an index chose.

        ``(True, device)`` for a one-index list, ``(True, None)`` for one process on the
        backend's current device, ``(False, None)`` for DDP.
        """
        parsed = self.parse_devices(devices)
        if isinstance(parsed, list) and len(parsed) == 1:
            return True, self.backend.device(parsed[0])
        return parsed == 1, None

    @property
    def process_group_backend(self) -> str:
        """The collective library DDP uses: ``backend.communication_backend``."""
        return self.backend.communication_backend

    def end_of_step(self) -> None:
        """Cut the lazy graph where a Lightning step ends (``backend.mark_step()``).

        Both front ends call it after each backward, after each optimizer step, and (the
        Trainer) before each validation, test and predict step; eager backends make it a
        no-op.
        """
        self.backend.mark_step()

    # Precision ---------------------------------------------------------------------------

    def mixed_precision(self, precision: Any) -> Mixed | None:
        """Return ``"bf16-mixed"`` or ``"16-mixed"``, or ``None`` for ``"32-true"``.

        Args:
            precision: ``"32-true"``, ``"bf16-mixed"`` or ``"16-mixed"`` (also ``32``,
                ``"bf16"``, ``16``).

        Raises:
            LightningSetupError: Another precision, or a dtype the backend does not compute
                in (``is_bf16_supported()``/``is_fp16_supported()`` is false).
        """
        backend = self.backend
        name = _ALIASES.get(precision, precision)
        if name not in PRECISIONS:
            raise lightning_error(
                f"precision={precision!r} is not supported; choose one of {', '.join(PRECISIONS)}."
            )
        if name == "32-true":
            return None
        bf16 = name == "bf16-mixed"
        if not (backend.is_bf16_supported() if bf16 else backend.is_fp16_supported()):
            raise lightning_error(
                f"precision={precision!r} needs {'bfloat16' if bf16 else 'float16'}, which the "
                f"{backend.name} backend does not compute in. Use precision='32-true' or the "
                "other mixed precision."
            )
        return "bf16-mixed" if bf16 else "16-mixed"

    @property
    def autocast_device_type(self) -> str:
        """Where mixed precision autocasts: ``backend.device_type`` (Lightning would say cuda)."""
        return self.backend.device_type
