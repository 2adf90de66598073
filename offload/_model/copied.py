"""The ``"copy-parameters"`` strategy of :class:`offload.OffloadModel`: parameters as copies.

Each slice runs its layers with device copies of its parameters and buffers put in
their places; the copies' gradients return to the host parameters through autograd.
With ``checkpoint_activation`` each slice (each micro-batch of it) is a non-reentrant
checkpoint whose inputs wait in host memory: nothing of the slice stays on the device
after its forward, and backward recomputes it, copying its parameters again. Without
it, the copies the slice's forward saves for backward stay on the device until then.

No ``mark_step`` between slices: on a lazy device a step advances the random seed, so
dropout would draw other masks than the model without offload.

Where the backend has streams (a PrivateUse1 device: torch refuses it the ``.data`` swap
too), the forward prefetches: while a slice computes, the next slice's parameters and
buffers are copied on the copy stream, and the compute stream waits for that copy's
event before the next slice uses them. A recomputation copies its slice itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
from torch import nn

from accel import Accelerator
from checkpointing import is_recomputing
from checkpointing._checkpoint import run_checkpoint

from .._core import strategy
from .._core.copier import Copier, Group
from .._core.copies import Slots, slots_of, substituted, unique, write_back
from .._core.transfer import Transfers
from .boundary import Spec, chunk_bounds, flatten, is_batched, merge, unflatten

__all__ = ["CopySlices"]


class CopySlices:
    """The slices of an :class:`offload.OffloadModel` whose parameters travel as copies.

    Args:
        layers: The model's layers.
        runs: Each slice's layers, as index ranges.
        backend: The backend (the checkpoints' RNG and host copies).
        device: The compute device.
        checkpoint_activation: Checkpoint each slice, its inputs kept in host memory.
        num_microbatches: Micro-batches per slice.
        batched_kwargs: Keyword arguments split with the batch.
    """

    def __init__(
        self,
        layers: Sequence[nn.Module],
        runs: Sequence[range],
        backend: Accelerator,
        device: torch.device,
        *,
        checkpoint_activation: bool,
        num_microbatches: int,
        batched_kwargs: frozenset[str],
    ) -> None:
        self._slices: list[tuple[str, Sequence[nn.Module], Slots]] = []
        for index, run in enumerate(runs):
            chunk = layers[run.start : run.stop]
            last = run.stop - 1
            span = f"layer {run.start}" if last == run.start else f"layers {run.start}-{last}"
            self._slices.append((f"slice {index} ({span})", chunk, slots_of(chunk)))
        self._backend = backend
        self._device = device
        self._copier = Copier(backend, device, Transfers(backend))
        self._copier.reserve([t for _, _, slots in self._slices for t in unique(slots)])
        self._prefetches = backend.supports_streams
        self._ahead: dict[int, Group | None] = {}
        self._checkpoint = checkpoint_activation
        self._microbatches = num_microbatches
        self._batched = batched_kwargs

    name: strategy.StrategyName = strategy.COPY_PARAMETERS

    @property
    def slice_bytes(self) -> tuple[int, ...]:
        """Bytes of parameters and buffers in each slice."""
        return tuple(
            sum(t.numel() * t.element_size() for t in unique(slots)) for _, _, slots in self._slices
        )

    @property
    def resident(self) -> tuple[int, ...]:
        """Nothing: a slice's copies are not tracked once made (see the module docstring)."""
        return ()

    @property
    def max_resident(self) -> int:
        """Nothing is tracked: 0."""
        return 0

    def is_home(self) -> bool:
        """Whether every parameter and buffer is in host memory (in its module)."""
        return all(
            tensor.device.type == "cpu"
            and (module._parameters if is_parameter else module._buffers)[name] is tensor
            for module, name, is_parameter, tensor in (
                slot for _, _, slots in self._slices for slot in slots
            )
        )

    def recover(self) -> None:
        """Forget a prefetch left by a forward that did not finish."""
        self._ahead.clear()

    def forward(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], batch: int | None
    ) -> tuple[tuple[Any, ...], bool]:
        """Run every slice; return the last one's values and whether it returned a tuple."""
        try:
            return self._forward(args, kwargs, batch)
        finally:
            self._ahead.clear()  # a forward that raised may leave a prefetch behind

    def _forward(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], batch: int | None
    ) -> tuple[tuple[Any, ...], bool]:
        values: tuple[Any, ...] = args
        returned_tuple = True
        for index, (name, _, _) in enumerate(self._slices):
            tensors, spec = flatten(values, kwargs, where=f"an input of {name}")
            bounds = chunk_bounds(batch, self._microbatches) if batch else [(0, 0)]
            names = spec.keyword_names()
            split = [
                len(bounds) > 1
                and is_batched(t, batch)
                and (k not in names or names[k] in self._batched)
                for k, t in enumerate(tensors)
            ]
            outputs: list[tuple[list[torch.Tensor], Spec]] = []
            for start, length in bounds:
                chunk = [
                    t.narrow(0, start, length) if split[k] else t for k, t in enumerate(tensors)
                ]
                outputs.append(self._run(index, spec, chunk))
            merged, out_spec, _ = merge(outputs, bounds, name)
            values, _ = unflatten(out_spec, merged)
            returned_tuple = self._returned_tuple
        return values, returned_tuple

    def _run(
        self, index: int, spec: Spec, tensors: list[torch.Tensor]
    ) -> tuple[list[torch.Tensor], Spec]:
        run = partial(self._layers, index, spec)
        if not (self._checkpoint and torch.is_grad_enabled()):
            outputs = run(*tensors)
        else:
            outputs = run_checkpoint(
                run, tuple(tensors), {}, use_reentrant=False, backend=self._backend, offload=True
            )
        return list(outputs), self._out_spec

    def _layers(self, index: int, spec: Spec, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        name, layers, slots = self._slices[index]
        hosts = unique(slots)
        recomputing = is_recomputing()
        ready = None if recomputing else self._ahead.pop(index, None)
        if not recomputing:
            self._prefetch(index + 1)
        loaded = self._copier.load(hosts, ready)
        copies = {id(host): copy for host, copy in zip(hosts, loaded, strict=True)}
        args, kwargs = unflatten(spec, tensors)
        returned_tuple = True
        with substituted(slots, copies), self._copier.interception.active():
            for layer in layers:
                out = layer(*args, **kwargs)
                returned_tuple = isinstance(out, tuple)
                args = out if returned_tuple else (out,)
        if not is_recomputing():
            write_back(slots, copies)
        outputs, self._out_spec = flatten(args, {}, where=f"a value returned by {name}")
        self._returned_tuple = returned_tuple
        return tuple(outputs)

    def _prefetch(self, index: int) -> None:
        """Copy slice ``index``'s tensors to the device on the copy stream, ahead of use."""
        if self._prefetches and index < len(self._slices) and index not in self._ahead:
            self._ahead[index] = self._copier.ahead(unique(self._slices[index][2]))
