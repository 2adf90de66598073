"""The offload grain (``"offload saved"``): a call's saved activations wait in host memory.

Nothing is recomputed: the forward sends the call's saved storages to pinned host memory
on the copy stream and backward fetches them back ahead of need
(:mod:`..._activation_offload`). Where the backend has copy streams the copies overlap
compute, and the grain is offered for a call only where they fit its window (the rule
torchtitan's solver uses): its bytes at the device-to-host rate within the call's
forward time, and at the host-to-device rate left over by parameter offload within its
backward time (twice its forward, as the cost model takes a backward it did not record).
What it then costs is the hooks per saved tensor and a copy's launch per storage.
Without copy streams the copies are synchronous and priced whole; on a host backend or
a lazy one the grain is never offered (:func:`offload_settings` says why in the note).

Its payload records what the plan was made with: the bytes it sends, the copies'
seconds, the pool's cap and the smallest storage copied.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from accel import Accelerator

from ..._activation_offload import ActivationOffloadWrapper
from ..._decisions import OFFLOADED
from .._offload_settings import OffloadSettings, window
from .._options import Call, Option, storage_bytes
from .._records import StepProfile
from ._base import Grain

__all__ = ["OFFLOAD", "OffloadPayload", "offload_note", "over_cap", "without_offload"]


@dataclass(frozen=True)
class OffloadPayload:
    """A plan's offload decision: what it sends and with which cap.

    Attributes:
        bytes: The saved bytes the call sends to host memory.
        copy_seconds: The copies' estimated seconds, both ways (hidden where they fit
            the call's window).
        host_bytes: The cap on the pinned host memory of the plan's copies.
        min_bytes: Storages smaller than this stay on the device.
    """

    bytes: int
    copy_seconds: float
    host_bytes: int
    min_bytes: int


class OffloadSaved(Grain[OffloadPayload]):
    """Send the call's saved activations to host memory; fetch them back for backward."""

    name = OFFLOADED
    coarseness = 5
    margin = 0.25
    fine = False

    def options(self, call: Call) -> list[Option]:
        """One option, where the planner was asked to offload and the copies fit."""
        settings = call.offload
        if settings is None or not call.name:  # the root is checkpointed whole or kept
            return []
        profile, record = call.profile, call.record
        sizes = profile.storage_bytes
        sent = frozenset(i for i in call.mine - call.inputs if sizes[i] >= settings.min_bytes)
        nbytes = storage_bytes(profile, sent)
        if not nbytes or nbytes > settings.host_bytes:
            return []
        out, back, hidden = window(nbytes, record.forward_time, settings)
        if settings.overlapped and not hidden:
            return []
        rates = profile.rates
        launches = 2 * len(sent) * rates.call_seconds
        seconds = rates.hook_seconds * len(record.packs) + launches
        if not hidden:
            seconds += out + back
        mib = nbytes / 2**20
        kind = f"offload: {mib:.2f} MiB, copies {1e3 * (out + back):.2f} ms"
        payload = OffloadPayload(nbytes, out + back, settings.host_bytes, settings.min_bytes)
        return [call.option(OFFLOADED, seconds, call.mine - sent, kind=kind, payload=payload)]

    def payload(self, profile: StepProfile, name: str, option: Option) -> OffloadPayload:
        """The bytes sent, the copies' seconds, the cap and the smallest storage sent."""
        return self.check(name, option.payload)

    def check(self, name: str, payload: object) -> OffloadPayload:
        """``payload``; ``ValueError`` unless it is an :class:`OffloadPayload`."""
        if isinstance(payload, OffloadPayload):
            return payload
        raise ValueError(
            f"checkpointing: this plan offloads {name!r} but gives no offload payload "
            f"(it gives {type(payload).__name__}). Use a plan made by plan_checkpointing."
        )

    def wrapper(
        self,
        module: nn.Module,
        payload: OffloadPayload,
        *,
        name: str,
        preserve_rng_state: bool,
        backend: Accelerator | None,
    ) -> nn.Module:
        """An :class:`ActivationOffloadWrapper` with the payload's cap."""
        return ActivationOffloadWrapper(
            module,
            cap_bytes=payload.host_bytes,
            min_bytes=payload.min_bytes,
            preserve_rng_state=preserve_rng_state,
            backend=backend,
        )

    def encode(self, payload: OffloadPayload) -> Any:
        """The payload's fields as a dict."""
        return {
            "bytes": payload.bytes,
            "copy_seconds": payload.copy_seconds,
            "host_bytes": payload.host_bytes,
            "min_bytes": payload.min_bytes,
        }

    def decode(self, value: Any) -> OffloadPayload:
        """The inverse of :meth:`encode`."""
        return OffloadPayload(
            int(value["bytes"]),
            float(value["copy_seconds"]),
            int(value["host_bytes"]),
            int(value["min_bytes"]),
        )


OFFLOAD = OffloadSaved()


def over_cap(chosen: Mapping[str, Option], settings: OffloadSettings | None) -> str | None:
    """The offloading call that sends the most, where the plan's copies pass the cap."""
    if settings is None:
        return None
    sent = {name: o.saved_bytes for name, o in chosen.items() if o.decision == OFFLOADED}
    if sum(sent.values()) <= settings.host_bytes:
        return None
    return max(sent, key=lambda name: (sent[name], name))


def without_offload(options: list[Option]) -> list[Option]:
    """``options`` less the offload grain's."""
    return [option for option in options if option.decision != OFFLOADED]


def offload_note(chosen: Mapping[str, Option], settings: OffloadSettings | None) -> str:
    """The plan's sentence on what it offloads, where it offloads anything."""
    sent = [o for o in chosen.values() if o.decision == OFFLOADED]
    if settings is None or not sent:
        return ""
    nbytes = sum(o.saved_bytes for o in sent)
    return (
        f"Offloads {nbytes / 2**20:.1f} MiB of saved activations from {len(sent)} module "
        f"call(s) to pinned host memory (cap {settings.host_bytes / 2**20:.0f} MiB; copies "
        f"at {settings.to_host_bytes / 1e9:.1f} GB/s out, "
        f"{settings.to_device_bytes / 1e9:.1f} GB/s back"
        f"{'' if settings.overlapped else ', synchronous: this backend has no copy streams'})."
    )
