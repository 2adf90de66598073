"""The offload grain's settings: whether it is offered, its copy rates and its cap.

They are inputs of the plan, decided before the search from the backend's capabilities,
the rates and the caller's arguments, never from what the host happens to have free:
the cap on pinned host memory is a number of bytes, by default a fixed share of the
host's total memory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from accel import Accelerator

from .._activation_offload import MIN_BYTES, refuse_host
from ._records import StepProfile

__all__ = [
    "HOST_SHARE",
    "OffloadRequest",
    "OffloadSettings",
    "host_memory_bytes",
    "offload_settings",
    "window",
]

#: The default cap on pinned host memory: this share of the host's total memory.
HOST_SHARE = 0.25


@dataclass(frozen=True)
class OffloadSettings:
    """What the offload grain is planned with (inputs of the plan, recorded in it).

    Attributes:
        host_bytes: The most pinned host memory the plan's copies may hold.
        to_host_bytes: Copy rate to the host, bytes per second.
        to_device_bytes: Copy rate back, bytes per second, after parameter offload's share.
        overlapped: The backend has copy streams: copies overlap compute.
        min_bytes: Storages smaller than this are not copied.
    """

    host_bytes: int
    to_host_bytes: float
    to_device_bytes: float
    overlapped: bool
    min_bytes: int = MIN_BYTES


def host_memory_bytes() -> int:
    """The host's total physical memory in bytes (not what happens to be free)."""
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


@dataclass(frozen=True)
class OffloadRequest:
    """What the caller of ``plan_checkpointing`` asked of the offload grain.

    Attributes:
        host_bytes: The cap on pinned host memory; ``None``: :data:`HOST_SHARE` of the
            host's total memory.
        parameter_reload_bytes: Bytes per step that parameter offload reloads over the
            same host-to-device direction.
    """

    host_bytes: int | None = None
    parameter_reload_bytes: int = 0

    @classmethod
    def of(
        cls, offload_activations: object, host_bytes: object, parameter_reload_bytes: object
    ) -> OffloadRequest | None:
        """The request the arguments make, or ``None`` where offload was not asked for.

        Raises:
            TypeError: If an argument has the wrong type.
            ValueError: If a byte count is negative, or given without offload.
        """
        if not isinstance(offload_activations, bool):
            raise TypeError(
                "checkpointing: offload_activations must be True or False, got "
                f"{type(offload_activations).__name__}."
            )
        for name, value in (
            ("offload_host_bytes", host_bytes),
            ("parameter_reload_bytes", parameter_reload_bytes),
        ):
            if value is None and name == "offload_host_bytes":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(
                    f"checkpointing: {name} must be a number of bytes (an int of at least "
                    f"0), got {value!r}. Pass e.g. {name}=8 * 2**30."
                )
        if not offload_activations:
            if host_bytes is not None or parameter_reload_bytes:
                raise ValueError(
                    "checkpointing: offload_host_bytes and parameter_reload_bytes shape "
                    "the offload grain, which is off. Pass offload_activations=True too, "
                    "or leave them out."
                )
            return None
        assert host_bytes is None or isinstance(host_bytes, int)
        assert isinstance(parameter_reload_bytes, int)
        return cls(host_bytes, parameter_reload_bytes)


def offload_settings(
    request: OffloadRequest, backend: Accelerator, profile: StepProfile
) -> tuple[OffloadSettings | None, str]:
    """The grain's settings for this planning, or ``None`` and the note saying why not."""
    try:
        refuse_host(backend)
    except ValueError as error:
        return None, f"Offload grain left out: {str(error).removeprefix('checkpointing: ')}"
    rates = profile.rates
    backward = profile.step_time - profile.forward_time
    reload_seconds = request.parameter_reload_bytes / rates.to_device_bytes
    share = reload_seconds / backward if backward > 0 else 1.0
    if share >= 1.0:
        return None, (
            "Offload grain left out: parameter offload's reloads "
            f"({request.parameter_reload_bytes} bytes) fill the host-to-device direction "
            "for the whole backward."
        )
    cap = request.host_bytes
    settings = OffloadSettings(
        host_bytes=int(host_memory_bytes() * HOST_SHARE) if cap is None else cap,
        to_host_bytes=rates.to_host_bytes,
        to_device_bytes=rates.to_device_bytes * (1.0 - share),
        overlapped=backend.supports_streams,
    )
    return settings, ""


def window(
    nbytes: int, forward_seconds: float, settings: OffloadSettings
) -> tuple[float, float, bool]:
    """A call's copies: seconds to the host, seconds back, and whether both hide.

    They hide where the copy out fits the call's forward and the copy back fits its
    backward (taken as twice the forward); without copy streams nothing hides.
    """
    out = nbytes / settings.to_host_bytes
    back = nbytes / settings.to_device_bytes
    hidden = settings.overlapped and out <= forward_seconds and back <= 2 * forward_seconds
    return out, back, hidden
