"""Saved activations kept in host memory between forward and backward (the offload grain).

While a wrapped module call runs forward, saved-tensor hooks send what autograd saves to
page-locked host memory on the backend's copy stream; the device memory is released as
soon as autograd's other holders drop it. When backward reaches the call's outputs, every
one of its copies starts back on the copy stream, so the reloads overlap the backward of
the layers after it, and each unpack waits for its own copy only.

Copies are made per *storage*, the unit the planner counts: a tensor and the views of it
saved in one call travel once, and each unpack rebuilds its view on the reloaded memory.
Never copied: parameters and buffers of the module, the call's inputs (other grains and
the caller keep them), storages below ``min_bytes`` (a copy's fixed cost outweighs them),
and anything already in host memory. Ordering is by the protocol's streams and events: a
device storage being copied out is held until the current stream has waited for the
copies at the end of the call's forward, and ``record_stream`` keeps a reload's block
from reuse while its copy may still write it.
Without streams the copies are synchronous, and still correct.

Host memory comes from a :class:`HostPool` per backend, allocated once per size and
reused every step, with a cap in bytes. Where the pool cannot give a buffer (the cap is
reached or the host cannot pin more), the tensor stays on the device for that step, one
warning says so with the figures, and from the next call on the module is checkpointed
whole: the plan's recompute fallback, never a silent slowdown. A buffer goes back to the
pool when autograd frees the graph that holds it, so an exception in forward or backward
leaves nothing behind.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any

import torch
from torch import nn

from accel import Accelerator

from ._host_pool import HostPool, host_pool
from ._offload import side_stream, version_witness
from ._steps import tensors_of
from ._wrapper import CheckpointWrapper

__all__ = ["ActivationOffloadWrapper", "HostPool", "host_pool", "refuse_host"]

#: Storages smaller than this are never offloaded by default (bytes).
MIN_BYTES = 1 << 20


def refuse_host(backend: Accelerator) -> None:
    """Raise where the backend's device is the host (or lazy): offloading has no target.

    Raises:
        ValueError: On such a backend, with what to do instead.
    """
    if backend.device().type == "cpu":
        raise ValueError(
            f"checkpointing: the {backend.name!r} backend computes in host memory, so "
            "offloading its activations to the host would copy them to where they are. "
            "Recompute them instead (any other grain), or plan on an accelerator."
        )
    if backend.is_lazy:
        raise ValueError(
            f"checkpointing: the {backend.name!r} backend is lazy: copying a saved "
            "activation to the host would run its pending graph in the middle of the "
            "forward. Recompute instead (any other grain)."
        )


class _Stored:
    """One storage's bytes in a host buffer, and its reload while backward needs it."""

    def __init__(
        self, device: torch.device, host: torch.Tensor, backend: Accelerator, pool: HostPool
    ) -> None:
        self.backend = backend
        self.host = host
        self.device = device
        self.nbytes = host.numel()
        self.packs = self.unpacks_left = 0
        self.reloaded: torch.Tensor | None = None
        self.reload_done: Any = None
        self.released = False
        # Back to the pool when autograd frees the graph that holds this (no cycle holds it),
        # or at once when the forward that made it raised (:meth:`release`).
        self._give = weakref.finalize(self, pool.give, host)

    def release(self) -> None:
        """Give the host buffer back now: the forward that filled it raised.

        Reusing it is safe: the next copy into it is queued on the same copy stream, after
        the one that filled it.
        """
        self.released = True
        self._give()

    def reload(self) -> None:
        """Start copying back to the device (on the copy stream where there is one)."""
        if self.released:
            raise RuntimeError(
                "checkpointing: a saved activation offloaded to host memory was needed "
                "after the forward of its module call raised, and its host buffer has been "
                "reused since. Run the forward again and call backward on the new output."
            )
        if self.reloaded is not None:
            return
        backend = self.backend
        reloaded = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
        if backend.supports_streams:
            side = side_stream(backend)
            side.wait_stream(backend.current_stream())
            with backend.stream(side):
                reloaded.copy_(self.host, non_blocking=True)
            self.reload_done = side.record_event()
            backend.record_stream(reloaded, side)
        else:
            reloaded.copy_(self.host)
        self.reloaded = reloaded

    def unpack(self) -> torch.Tensor:
        """The reloaded bytes, ready for the current stream; dropped after the last unpack."""
        self.reload()
        reloaded = self.reloaded
        assert reloaded is not None
        if self.reload_done is not None:
            self.backend.current_stream().wait_event(self.reload_done)
        self.unpacks_left -= 1
        if self.unpacks_left <= 0:  # a second backward (retain_graph) reloads again
            self.reloaded, self.reload_done = None, None
            self.unpacks_left = self.packs
        return reloaded


def _on_host(tensor: torch.Tensor) -> bool:
    return tensor.device.type == "cpu"


def _kept_anyway(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s memory stays whatever is offloaded: a parameter or its view.

    Parameters of the call's own module are kept by storage already; this catches the
    others: a weight the module reads from elsewhere (a head tied to the embedding saves
    a transposed view of it), and any other leaf that requires grad.
    """
    root = tensor if tensor._base is None else tensor._base
    return isinstance(root, nn.Parameter) or (root.is_leaf and root.requires_grad)


def _raw(tensor: torch.Tensor) -> torch.Tensor:
    """Every byte of ``tensor``'s storage, as a flat ``uint8`` tensor on its device."""
    storage = tensor.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(
        storage, 0, (storage.nbytes(),), (1,)
    )


class _Packed:
    """What autograd holds for an offloaded saved tensor: its storage's copy and its view."""

    __slots__ = (
        "dtype",
        "offset",
        "requires_grad",
        "size",
        "stored",
        "stride",
        "version",
        "witness",
    )

    def __init__(self, tensor: torch.Tensor, stored: _Stored) -> None:
        self.stored = stored
        self.dtype, self.offset = tensor.dtype, tensor.storage_offset()
        self.size, self.stride = tuple(tensor.shape), tuple(tensor.stride())
        self.requires_grad = tensor.requires_grad
        self.witness, self.version = version_witness(tensor), tensor._version


class _Offload:
    """The saved-tensor hooks of one forward of one wrapped call."""

    def __init__(self, wrapper: ActivationOffloadWrapper, backend: Accelerator, keep: set[int]):
        self.wrapper, self.backend, self.pool = wrapper, backend, wrapper.pool(backend)
        self.keep = keep  # storages never offloaded: parameters, buffers, the call's inputs
        self.stored: dict[int, _Stored] = {}
        self.refused_bytes = 0
        # Device storages whose copy to the host may still be reading them: held until
        # the current stream has waited for the copies (:meth:`finish`).
        self.in_flight: list[torch.Tensor] = []

    def pack(self, tensor: torch.Tensor) -> Any:
        """``tensor`` itself where it stays on the device, else its :class:`_Packed` copy."""
        if _on_host(tensor) or _kept_anyway(tensor):
            return tensor
        storage = tensor.untyped_storage()
        pointer, nbytes = storage.data_ptr(), storage.nbytes()
        if pointer in self.keep or nbytes < self.wrapper.min_bytes:
            return tensor
        stored = self.stored.get(pointer)
        if stored is None:
            host = self.pool.take(nbytes)
            if host is None:
                self.refused_bytes += nbytes
                return tensor
            stored = self.stored[pointer] = _Stored(tensor.device, host, self.backend, self.pool)
            self._send(_raw(tensor), host)
        stored.packs += 1
        stored.unpacks_left += 1
        return _Packed(tensor, stored)

    def _send(self, raw: torch.Tensor, host: torch.Tensor) -> None:
        backend = self.backend
        # Held until the call's forward ends, with or without streams: ``self.stored`` is
        # keyed by address, and a storage freed during the forward would give its address
        # to a new tensor, which would then come back with the old one's values.
        self.in_flight.append(raw)
        if not backend.supports_streams:
            host.copy_(raw)
            return
        side = side_stream(backend)
        side.wait_stream(backend.current_stream())
        with backend.stream(side):
            host.copy_(raw, non_blocking=True)

    def finish(self) -> None:
        """Order the current stream after the copies, then let their device memory go.

        The copies fit the call's forward (the window the planner allows), so the wait
        costs nothing where the plan holds; the memory is reused only after it.
        """
        backend = self.backend
        if self.in_flight and backend.supports_streams:
            backend.current_stream().wait_event(side_stream(backend).record_event())
        self.in_flight.clear()

    def abort(self) -> None:
        """Give every host buffer of this call back: its forward raised."""
        stored, self.stored = self.stored, {}
        for entry in stored.values():
            entry.release()

    def prefetch(self, _grad: Any = None) -> None:
        """Start every reload of this call: backward has reached its outputs."""
        stored, self.stored = self.stored, {}
        for entry in stored.values():
            entry.reload()


def _unpack(packed: Any) -> torch.Tensor:
    if not isinstance(packed, _Packed):
        return packed  # type: ignore[no-any-return]
    if packed.witness._version != packed.version:
        raise RuntimeError(
            "checkpointing: one of the variables needed for gradient computation has been "
            "modified by an inplace operation: a saved activation offloaded to host memory "
            f"([{packed.dtype} {list(packed.size)}]) is at version "
            f"{packed.witness._version}; expected version {packed.version} instead. Write "
            "out of place after the module (x = x + f(x) instead of x += f(x))."
        )
    raw = packed.stored.unpack()
    view = torch.empty(0, dtype=packed.dtype, device=raw.device)
    view.set_(raw.untyped_storage(), packed.offset, packed.size, packed.stride)
    return view.requires_grad_(packed.requires_grad) if packed.requires_grad else view


class ActivationOffloadWrapper(CheckpointWrapper):
    """Runs a module with its saved activations in host memory until backward needs them.

    Build it through a plan (``"offload saved"``); its forward runs the module once, so
    random draws are as without it. Under ``torch.compile`` the call is checkpointed
    whole instead (saved-tensor hooks cannot be traced).

    Args:
        module: The module whose calls offload.
        cap_bytes: The most host bytes the backend's :class:`HostPool` may allocate.
        min_bytes: Storages smaller than this stay on the device.
        preserve_rng_state: For the recompute fallback (see :class:`CheckpointWrapper`).
        backend: The backend or its name; ``None``: :func:`accel.get_backend` at each call.
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        cap_bytes: int,
        min_bytes: int = MIN_BYTES,
        preserve_rng_state: bool = True,
        backend: Accelerator | str | None = None,
    ) -> None:
        super().__init__(module, preserve_rng_state=preserve_rng_state, backend=backend)
        self.cap_bytes, self.min_bytes = cap_bytes, min_bytes
        self.fallen_back = False

    def extra_repr(self) -> str:
        return f"offload saved, cap {self.cap_bytes} bytes, min {self.min_bytes} bytes"

    def pool(self, backend: Accelerator) -> HostPool:
        """The host pool of ``backend``, with at least this wrapper's cap."""
        return host_pool(backend, self.cap_bytes)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the module, its saved activations offloaded (or, after a shortfall, recomputed)."""
        import accel

        if not torch.is_grad_enabled():
            return self.module(*args, **kwargs)
        # Saved-tensor hooks cannot be traced: compiled, the call is checkpointed whole,
        # which keeps less than the plan's estimate for it (its inputs only).
        if self.fallen_back or torch.compiler.is_compiling():
            return super().forward(*args, **kwargs)
        backend = self._backend_ref.get() or accel.get_backend()
        refuse_host(backend)
        module = self.module
        kept = (*module.parameters(), *module.buffers(), *tensors_of((args, kwargs)))
        keep = {t.untyped_storage().data_ptr() for t in kept}
        hooks = _Offload(self, backend, keep)
        try:
            with torch.autograd.graph.saved_tensors_hooks(hooks.pack, _unpack):
                output = self.module(*args, **kwargs)
        except BaseException:
            # Now, not when the exception's traceback lets the partial graph go.
            hooks.abort()
            raise
        finally:
            hooks.finish()
        if hooks.stored:
            for tensor in tensors_of(output):
                if tensor.requires_grad:
                    tensor.register_hook(hooks.prefetch)
        if hooks.refused_bytes:
            self._fall_back(hooks)
        return output

    def _fall_back(self, hooks: _Offload) -> None:
        self.fallen_back = True
        pool = hooks.pool
        warnings.warn(
            f"checkpointing: host memory for offloaded activations ran out: "
            f"{hooks.refused_bytes} bytes of this call stayed on the device (the pool "
            f"holds {pool.allocated_bytes} of its {pool.cap_bytes}-byte cap, or the host "
            "could not pin more). This module is checkpointed whole from its next call on. "
            "Raise offload_host_bytes when planning, or plan without offload.",
            RuntimeWarning,
            stacklevel=3,
        )
