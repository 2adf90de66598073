"""One forward through the slices of an :class:`offload.OffloadModel`, and its backward.

Each slice runs inside an autograd Function, :class:`offload._model.run.SliceFunction`
(which imports this module; this one imports only :mod:`offload._model.config`). Its
forward loads
the slice (prefetching the next one), computes every micro-batch, and drops the slice;
its backward loads the slice again (prefetching the previous one, and the previous
slice's saved inputs), back-propagates every micro-batch through the slice with a
nested call to :func:`torch.autograd.backward`, sends the gradients to the host, and
returns the gradients of the slice's inputs. Because a slice's whole backward happens
inside one call, the order is fixed: slice ``i``'s backward ends before slice
``i - 1``'s begins, whatever else the graph contains.

Without ``checkpoint_activation`` the forward builds each micro-batch's graph on
detached inputs and keeps it (activations stay on the device, as without offload).
With it, each micro-batch runs through :func:`checkpointing.checkpoint`, which keeps
only its inputs and recomputes the rest in backward, replaying dropout's generator
states and autocast and calling ``backend.mark_step()`` before recomputing. Those
inputs, the slice-boundary activations, are copied to host memory on the copy stream
and their device memory is released (the saved tensors point at a placeholder that
holds no memory until backward copies the values back).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from checkpointing import checkpoint

from .._core.transfer import dense_stride, placeholder
from .._errors import OffloadError
from .._state import State
from .boundary import Spec, chunk_bounds, flatten, is_batched, merge, unflatten
from .config import Config, Pass

__all__ = ["SliceRun"]


@dataclass
class _Offloaded:
    """One slice input kept in host memory between forward and backward."""

    host: torch.Tensor
    shape: torch.Size
    stride: tuple[int, ...]
    dtype: torch.dtype
    # Per micro-batch: the saved leaf and the rows of the input it holds (None: all).
    leaves: list[tuple[torch.Tensor, tuple[int, int] | None]] = field(default_factory=list)


class SliceRun:
    """Slice ``index`` of one pass: its forward, its saved state, its backward.

    Args:
        config: The model's configuration.
        pass_: The pass this run belongs to.
        index: The slice.
        spec: Where the input tensors go among the slice's arguments.
    """

    def __init__(self, config: Config, pass_: Pass, index: int, spec: Spec) -> None:
        self.config = config
        self.pass_ = pass_
        self.index = index
        self.storage = config.slices[index]
        self.spec = spec
        self.out_spec: Spec | None = None
        self.returned_tuple = False
        self._keyword = spec.keyword_indices()
        self._bounds: list[tuple[int, int]] = []
        self._split: list[bool] = []
        self._needs_grad: list[bool] = []
        self._leaves: list[list[torch.Tensor]] = []
        self._roots: list[list[torch.Tensor]] = []
        self._concatenated: list[bool] = []
        self._offloaded: list[_Offloaded] = []
        self._restored: Any = None
        self._stored: Any = None
        self._restore_issued = False
        self._released = False
        pass_.add(self)

    # Forward ---------------------------------------------------------------------------

    def forward(self, tensors: Sequence[torch.Tensor], *, graph: bool) -> list[torch.Tensor]:
        """Run the slice on ``tensors``; with ``graph``, keep what its backward needs."""
        config, residency = self.config, self.config.residency
        residency.issue(self.index)
        if self.index + 1 < len(config.slices):
            residency.issue(self.index + 1)
        batch = self.pass_.batch
        bounds = chunk_bounds(batch, config.num_microbatches) if batch else [(0, 0)]
        if len(bounds) == 1:
            split = [False] * len(tensors)
        else:
            # Positional tensors, and the keyword tensors the user marked as batched.
            names = self.spec.keyword_names()
            split = [
                is_batched(t, batch) and (k not in names or names[k] in config.batched_kwargs)
                for k, t in enumerate(tensors)
            ]
        self._bounds, self._split = bounds, split
        self._needs_grad = [t.requires_grad for t in tensors]
        chunks = [
            [
                (t.narrow(0, start, length) if split[k] else t).detach()
                for k, t in enumerate(tensors)
            ]
            for start, length in bounds
        ]
        if graph:
            for chunk in chunks:
                for k, leaf in enumerate(chunk):
                    leaf.requires_grad_(self._needs_grad[k])
            if config.checkpoint_activation and config.copy:
                self._offload_inputs(tensors, chunks)
        residency.attach(self.index)
        outputs: list[tuple[list[torch.Tensor], Spec]] = []
        # A cached low-precision cast of a weight would stay on the device until the
        # outermost autocast exits, outside the two-slice budget: cast anew instead.
        cache = torch.is_autocast_cache_enabled()
        if config.copy:
            torch.set_autocast_cache_enabled(False)
        try:
            self._compute(chunks, outputs, graph=graph)
        finally:
            torch.set_autocast_cache_enabled(cache)
        residency.detach(self.index, grads_to_host=False, buffers_to_host=True)
        config.backend.mark_step()
        merged, spec, concatenated = merge(outputs, bounds, self.storage.name)
        self.out_spec = spec
        if not graph:
            return merged
        self._leaves = chunks
        self._roots = [tensors for tensors, _ in outputs]
        self._concatenated = concatenated
        results = [t if concatenated[k] else t.detach() for k, t in enumerate(merged)]
        if config.checkpoint_activation:
            # Only the checkpoints' outputs: nothing saved them, and backward needs no
            # more than their shapes. (Without checkpointing, a root may be saved by the
            # graph, so it keeps its memory.)
            for roots in self._roots:
                for root in roots:
                    root.data = placeholder(root)
        for offloaded in self._offloaded:
            for leaf, _ in offloaded.leaves:
                leaf.data = placeholder(leaf)
        return results

    def _compute(
        self,
        chunks: list[list[torch.Tensor]],
        outputs: list[tuple[list[torch.Tensor], Spec]],
        *,
        graph: bool,
    ) -> None:
        config = self.config
        for chunk in chunks:
            if not graph:
                outputs.append(self._run_layers(chunk))
            elif config.checkpoint_activation:
                dummy = config.trainable_dummy if self.storage.trainable else config.frozen_dummy
                with torch.enable_grad():
                    result = checkpoint(
                        self._checkpointed,
                        dummy,
                        *chunk,
                        use_reentrant=True,
                        backend=config.backend,
                    )
                assert self.out_spec is not None
                outputs.append((list(result), self.out_spec))
            else:
                with torch.enable_grad():
                    outputs.append(self._run_layers(chunk))

    def _run_layers(self, tensors: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], Spec]:
        args, kwargs = unflatten(self.spec, tensors)
        returned_tuple = True
        interception = self.config.interception
        with interception.active() if interception is not None else nullcontext():
            for layer in self.storage.layers:
                out = layer(*args, **kwargs)
                returned_tuple = isinstance(out, tuple)
                args = out if returned_tuple else (out,)
        self.returned_tuple = returned_tuple
        return flatten(args, {}, where=f"a value returned by {self.storage.name}")

    def _checkpointed(
        self, dummy: torch.Tensor, *tensors: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        del dummy  # Only there so that the checkpoint has an input that requires grad.
        outputs, spec = self._run_layers(tensors)
        self.out_spec = spec
        return tuple(outputs)

    def _offload_inputs(
        self, tensors: Sequence[torch.Tensor], chunks: list[list[torch.Tensor]]
    ) -> None:
        """Copy this slice's boundary inputs to the host, on the copy stream."""
        transfers = self.config.transfers
        positional = [k for k in range(len(tensors)) if k not in self._keyword]
        if not positional:
            return
        transfers.copy_waits_for_compute(store=True)
        with transfers.on_copy_stream(store=True):
            for k in positional:
                tensor = tensors[k]
                host = self.config.pool.acquire(tensor)
                host.copy_(tensor, non_blocking=transfers.non_blocking)
                transfers.used_by(tensor, transfers.store_stream)
                offloaded = _Offloaded(host, tensor.shape, dense_stride(tensor), tensor.dtype)
                for chunk, (start, length) in zip(chunks, self._bounds, strict=True):
                    rows = (start, length) if self._split[k] else None
                    offloaded.leaves.append((chunk[k], rows))
                self._offloaded.append(offloaded)
        self._stored = transfers.copy_event(store=True)

    # Backward --------------------------------------------------------------------------

    def issue_restore(self) -> None:
        """Start copying this slice's offloaded inputs back to the device."""
        if self._restore_issued or not self._offloaded:
            return
        self._restore_issued = True
        config, transfers = self.config, self.config.transfers
        transfers.copy_waits(self._stored)  # the host copies were made on the store stream
        with transfers.on_copy_stream() as compute:
            for offloaded in self._offloaded:
                device = torch.empty_strided(
                    offloaded.shape, offloaded.stride, dtype=offloaded.dtype, device=config.device
                )
                device.copy_(offloaded.host, non_blocking=transfers.non_blocking)
                transfers.used_by(device, compute)
                for leaf, rows in offloaded.leaves:
                    leaf.data = device if rows is None else device.narrow(0, *rows)
        self._restored = transfers.copy_event()
        for offloaded in self._offloaded:
            config.pool.release(offloaded.host, self._restored)

    def backward(self, grads: Sequence[torch.Tensor | None]) -> list[torch.Tensor | None]:
        """Back-propagate ``grads`` (for the outputs) through the slice."""
        if self._released:
            raise OffloadError(
                f"offload: backward reached {self.storage.name} a second time; OffloadModel "
                "frees each slice's graph after its backward, so backward(retain_graph=True) "
                "followed by another backward is not supported. Run forward again."
            )
        config, residency, index = self.config, self.config.residency, self.index
        config.state.enter(State.BACKWARD_PRE, why=f"backward reached {self.storage.name}")
        try:
            residency.issue(index, grads=True)
            self.issue_restore()
            first = self.pass_.first_graph
            if first is not None and index > first:
                residency.issue(index - 1, grads=True)
                previous = self.pass_.run(index - 1)
                if previous is not None:
                    previous.issue_restore()
            residency.attach(index, grads=True)
            config.transfers.compute_waits(self._restored)
            for chunk, (roots, (start, length)) in enumerate(
                zip(self._roots, self._bounds, strict=True)
            ):
                pairs = []
                for k, (root, grad) in enumerate(zip(roots, grads, strict=True)):
                    if grad is None or not root.requires_grad:
                        continue
                    if self._concatenated[k] and len(self._bounds) > 1:
                        pairs.append((root, grad.narrow(0, start, length)))
                    elif chunk == 0:
                        pairs.append((root, grad))
                if pairs:
                    torch.autograd.backward([r for r, _ in pairs], [g for _, g in pairs])
            input_grads = self._input_grads()
        except BaseException:
            residency.detach(index, grads_to_host=False, buffers_to_host=False)
            residency.release_all(buffers_to_host=False)
            config.state.reset()
            self.release()
            raise
        residency.detach(index, grads_to_host=True, buffers_to_host=False)
        config.backend.mark_step()
        self.release()
        if index == self.pass_.first_graph:
            config.transfers.wait_host()
            residency.drop_pending()
            config.state.enter(State.BACKWARD_POST, why=f"backward of {self.storage.name}")
            config.state.enter(State.IDLE, why="backward finished")
        else:
            config.state.enter(State.BACKWARD_POST, why=f"backward of {self.storage.name}")
        return input_grads

    def _input_grads(self) -> list[torch.Tensor | None]:
        result: list[torch.Tensor | None] = []
        for k, needs in enumerate(self._needs_grad):
            if not needs:
                result.append(None)
                continue
            column = [chunk[k] for chunk in self._leaves]
            grads = [leaf.grad for leaf in column]
            if all(g is None for g in grads):
                result.append(None)
            elif len(column) == 1:
                result.append(grads[0])
            elif self._split[k]:
                parts = [
                    g if g is not None else torch.zeros_like(leaf)
                    for g, leaf in zip(grads, column, strict=True)
                ]
                result.append(torch.cat(parts))
            else:
                total: torch.Tensor | None = None
                for g in grads:
                    if g is not None:
                        total = g if total is None else total + g
                result.append(total)
        return result

    def release(self) -> None:
        """Drop everything kept for backward."""
        self._released = True
        self._leaves, self._roots, self._offloaded = [], [], []
        self._restored = None
