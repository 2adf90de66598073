"""``OffloadModel``: train a sequential model larger than device memory.

The model is split into slices balanced by parameter bytes. The slices live in pinned
host memory and come to the device one at a time, in forward and again in backward,
the next one loading on a copy stream while the current one computes; how, is one of
two strategies (:mod:`offload._model.strategies`). Gradients are copied back to the host
as each slice's backward ends, so an optimizer over the host parameters can step right
after ``backward`` returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from accel import Accelerator
from checkpointing._state_dict import keep_plain_keys

from .._core.transfer import resolve_backend, resolve_device
from .._errors import OffloadConfigError, OffloadError, UnsupportedModelError
from .._state import State, StateMachine
from .run import parameter_bytes
from .slicing import partition
from .strategies import SliceStrategy, make_strategy

__all__ = ["OffloadModel"]

_HOST = torch.device("cpu")


def _layers(model: Any) -> list[nn.Module]:
    if isinstance(model, nn.Sequential):
        return list(model)
    if isinstance(model, list | tuple | nn.ModuleList):
        layers = list(model)
        strays = [type(layer).__name__ for layer in layers if not isinstance(layer, nn.Module)]
        if strays:
            raise UnsupportedModelError(
                f"offload: OffloadModel got a list whose items are not all nn.Module "
                f"(found {', '.join(strays)}); pass a list of modules run one after the other."
            )
        return layers
    raise UnsupportedModelError(
        f"offload: OffloadModel splits a model into consecutive slices, so it needs an "
        f"nn.Sequential or a list of modules run one after the other, not "
        f"{type(model).__name__}. For a model with branches or skip connections use "
        "offload.offload_parameters(model), which loads each submodule's parameters when "
        "it runs; or express the model as nn.Sequential."
    )


class OffloadModel(nn.Module):
    """Trains an ``nn.Sequential`` (or list of modules) whose parameters exceed device memory.

    The constructor is compatible with fairscale's ``OffloadModel``. The layers are split
    into ``num_slices`` consecutive slices balanced by parameter bytes. Each slice's
    parameters and buffers are packed into page-locked host memory, once. Forward and
    backward bring one slice at a time to the device and load the next one on a copy
    stream while the current one computes; at most two slices are on the device at once.
    Gradients end up in host memory, next to the parameters, so an optimizer over
    ``model.parameters()`` steps on the host; ``backward`` waits for the last copy, so
    they are ready when it returns. A gradient handed out is never rewritten by a later
    step: after ``zero_grad(set_to_none=True)`` the next backward gives new host tensors.
    Tensors used by several slices (tied weights) are packed once and loaded with every
    slice that uses them; their gradient sums those slices' contributions.
    ``state_dict()`` has the wrapped model's own keys, so checkpoints move between the
    wrapper and the plain model.

    The layers are called as ``out = layer(*out, **kwargs)``: a tuple returned by a layer
    becomes the next layer's positional arguments, and the keyword arguments of
    :meth:`forward` go to every layer. Tensors and other values may cross slice
    boundaries; tensors inside lists or dicts may not.

    Example::

        model = OffloadModel(nn.Sequential(*blocks), num_slices=4)
        optimizer = torch.optim.AdamW(model.parameters())
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()

    Args:
        model: An ``nn.Sequential`` or a list of modules.
        device: Where to compute; ``None`` means ``backend.device()``.
        offload_device: Where parameters and gradients live; must be the host (``cpu``).
        num_slices: How many slices; at most the number of layers.
        checkpoint_activation: Keep only the slice-boundary activations, in host memory,
            and recompute each slice in backward through :func:`checkpointing.checkpoint`
            (dropout and autocast are replayed exactly).
        num_microbatches: Split the batch into this many micro-batches for each slice's
            compute; the outputs are concatenated again. Split are the positional tensors
            whose first dimension is the batch size (that of the first positional input)
            and the keyword tensors named in ``batched_kwargs``; everything else goes
            whole to every micro-batch. Layers that mix samples (batch norm) then see
            each micro-batch on its own.
        backend: The backend or its name; ``None`` means :func:`accel.get_backend`.
        batched_kwargs: Keyword arguments whose tensors hold one row per sample, split
            with the batch (e.g. ``("attention_mask",)``).

    Raises:
        offload.UnsupportedModelError: ``model`` is neither sequential nor a list of
            modules, or has no layers.
        offload.OffloadConfigError: More slices than layers, a bad count, a device the
            backend cannot use, a non-host ``offload_device``, a bad ``backend`` or
            ``batched_kwargs``.

    How slices reach the device is :attr:`strategy_name`: ``"swap-data"`` (the double
    buffers above) or, on a device whose tensors cannot take a host tensor's place (a
    lazy-tensor runtime's, a PrivateUse1 device's), ``"copy-parameters"``: the slices
    load their parameters as differentiable copies (see :mod:`offload._core.copies`);
    ``resident_slices`` and ``max_resident_slices`` then count nothing, and the model
    must be built on the host. Either way the linear and embedding layers write their
    weights' gradients straight into device memory kept from step to step
    (:mod:`offload._core.grads`).

    Limitations: backward is ``loss.backward()`` (or :meth:`offload.Engine.backward`),
    not ``torch.autograd.grad``; one backward per forward; a slice's first layer must
    not modify its input in place; buffers must be updated in place (as batch norm does);
    do not call ``.to()`` on the wrapper (convert the model before wrapping it).
    """

    def __init__(
        self,
        model: nn.Sequential | Sequence[nn.Module],
        device: torch.device | str | None = None,
        offload_device: torch.device | str = _HOST,
        num_slices: int = 3,
        checkpoint_activation: bool = False,
        num_microbatches: int = 1,
        backend: Accelerator | str | None = None,
        *,
        batched_kwargs: Sequence[str] = (),
    ) -> None:
        super().__init__()
        layers = _layers(model)
        if isinstance(batched_kwargs, str) or not all(
            isinstance(name, str) for name in batched_kwargs
        ):
            raise OffloadConfigError(
                f"offload: batched_kwargs must be a sequence of keyword names, got "
                f"{batched_kwargs!r}; e.g. batched_kwargs=('attention_mask',)."
            )
        batched = frozenset(batched_kwargs)
        if not layers:
            raise UnsupportedModelError(
                f"offload: OffloadModel got an empty {type(model).__name__} (no layers), so "
                "there is nothing to split into slices; pass the model's layers in order, "
                "e.g. OffloadModel(nn.Sequential(*blocks)), with at least num_slices of them."
            )
        for name, value in (("num_slices", num_slices), ("num_microbatches", num_microbatches)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise OffloadConfigError(f"offload: {name} must be a positive int, got {value!r}.")
        if num_slices > len(layers):
            raise OffloadConfigError(
                f"offload: num_slices={num_slices} is more than the model's {len(layers)} "
                f"layers; every slice needs at least one layer. Pass num_slices <= "
                f"{len(layers)}, or split large layers into several modules."
            )
        backend = resolve_backend(backend)
        compute_device = resolve_device(device, backend)
        home = torch.device(offload_device)
        if home.type != "cpu":
            raise OffloadConfigError(
                f"offload: offload_device must be host memory ('cpu'), got {str(home)!r}."
            )
        self.module = model if isinstance(model, nn.Sequential) else nn.ModuleList(layers)
        runs = partition([parameter_bytes(layer) for layer in layers], num_slices)
        self._state = StateMachine("OffloadModel")
        self._strategy: SliceStrategy = make_strategy(
            self.module,
            layers,
            runs,
            backend=backend,
            device=compute_device,
            home=home,
            state=self._state,
            checkpoint_activation=bool(checkpoint_activation),
            num_microbatches=num_microbatches,
            batched_kwargs=batched,
        )
        self._backend = backend
        self._device = compute_device
        self._offload_device = home
        self._runs = tuple((run.start, run.stop) for run in runs)
        self.num_slices = num_slices
        self.checkpoint_activation = bool(checkpoint_activation)
        self.num_microbatches = num_microbatches
        self.batched_kwargs = batched
        keep_plain_keys(self, "module")

    # Read-only views -------------------------------------------------------------------

    @property
    def backend(self) -> Accelerator:
        """The backend whose streams, events and pinned memory are used."""
        return self._backend

    @property
    def device(self) -> torch.device:
        """Where the slices compute."""
        return self._device

    @property
    def offload_device(self) -> torch.device:
        """Where parameters and gradients live between uses."""
        return self._offload_device

    @property
    def slices(self) -> tuple[tuple[int, int], ...]:
        """Each slice's layers as ``(start, stop)`` indices into the model."""
        return self._runs

    @property
    def slice_bytes(self) -> tuple[int, ...]:
        """Bytes of parameters and buffers in each slice."""
        return self._strategy.slice_bytes

    @property
    def resident_slices(self) -> tuple[int, ...]:
        """Indices of the slices whose parameters are in device memory now (at most two)."""
        return self._strategy.resident

    @property
    def max_resident_slices(self) -> int:
        """The most slices that were in device memory at once since construction."""
        return self._strategy.max_resident

    @property
    def strategy_name(self) -> str:
        """How slices reach the device: ``"swap-data"`` or ``"copy-parameters"``."""
        return self._strategy.name

    @property
    def state(self) -> State:
        """``IDLE`` between steps; ``FORWARD`` or ``BACKWARD_*`` while one runs."""
        return self._state.state

    # Behaviour -------------------------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the layers on ``args`` (moved to the device), giving ``kwargs`` to each layer.

        Args:
            *args: The first layer's positional arguments; tensors move to the device.
            **kwargs: Keyword arguments for every layer; tensors move to the device.

        Returns:
            What the last layer returns, on the device.

        Raises:
            offload.OffloadError: A value crossing a slice boundary cannot be handled (see
                the message), or the model was called from inside its own forward.
        """
        if self._state.state is State.FORWARD:
            raise OffloadError(
                "offload: OffloadModel.forward was called while its forward is running "
                "(a layer called the model again); a model cannot contain itself."
            )
        if self._state.state is not State.IDLE:
            self.recover()
        args = tuple(self._to_device(value) for value in args)
        kwargs = {name: self._to_device(value) for name, value in kwargs.items()}
        batch = next(
            (v.shape[0] for v in args if isinstance(v, torch.Tensor) and v.dim() > 0), None
        )
        if batch is not None and 1 < self.num_microbatches > batch:
            raise OffloadConfigError(
                f"offload: this OffloadModel splits each batch into num_microbatches="
                f"{self.num_microbatches} micro-batches, but the batch has {batch} rows, so "
                f"it cannot be split {self.num_microbatches} ways. Pass batches of at least "
                f"{self.num_microbatches} rows, or build the model with num_microbatches <= "
                f"{batch}."
            )
        self._state.enter(State.FORWARD, why="forward started")
        try:
            values, returned_tuple = self._strategy.forward(
                args, kwargs, batch if self.num_microbatches > 1 else None
            )
        except BaseException:
            self._state.reset()
            raise
        self._state.enter(State.IDLE, why="forward finished")
        if not returned_tuple and len(values) == 1:
            return values[0]
        return values

    def _to_device(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.device != self._device:
            return value.to(self._device, non_blocking=True)
        return value

    def recover(self) -> None:
        """Bring every parameter and gradient back to host memory and the state to IDLE.

        Forward and backward do this themselves when they fail; call it after an
        exception elsewhere in a step (the next forward also does it).
        """
        self._strategy.recover()
        self._state.reset()

    def is_home(self) -> bool:
        """Whether every parameter and buffer is in its host memory (true between steps)."""
        return self._strategy.is_home()

    def _apply(self, fn: Any, recurse: bool = True) -> OffloadModel:
        raise OffloadError(
            "offload: OffloadModel keeps its parameters in host memory and moves each slice "
            "itself, so .to(), .half() and other device or dtype conversions are not supported on "
            "it; convert the model before wrapping it."
        )

    def extra_repr(self) -> str:
        return (
            f"device={self._device}, offload_device={self._offload_device}, "
            f"slices={list(self._runs)}, checkpoint_activation={self.checkpoint_activation}, "
            f"num_microbatches={self.num_microbatches}"
        )
