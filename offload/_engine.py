"""``Engine``: backward and optimizer step with gradient accumulation and loss scaling.

The contract, written down (DeepSpeed's engine leaves parts of it implicit):

* :meth:`Engine.backward` divides the loss by ``gradient_accumulation_steps`` (unless
  ``scale_wrt_gas=False``), multiplies it by the loss scale when one is set, runs
  backward, and calls ``backend.mark_step()``. Gradients accumulate in ``.grad`` (on
  the host for offloaded parameters).
* :meth:`Engine.step` is called after every backward. Only at an accumulation boundary
  (every ``gradient_accumulation_steps``-th call, or one forced with
  :meth:`Engine.set_gradient_accumulation_boundary`) does it wait for the device,
  unscale the gradients, skip the step if any of them is inf or NaN (under loss
  scaling), clip the unscaled gradients' norm to ``gradient_clipping``, step the
  optimizer and then the LR scheduler, zero the gradients, update the scale and call
  ``backend.mark_step()``. A skipped step does not advance the scheduler.
* :meth:`Engine.step` without an :meth:`Engine.backward` since the previous step
  raises: it would count a step that has no gradients.
* An exception in backward brings every offloaded parameter and gradient home
  (:meth:`offload.OffloadModel.recover`, :meth:`offload.ParameterOffload.recover`)
  before it propagates.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn

from accel import Accelerator

from ._core.transfer import resolve_backend
from ._errors import OffloadConfigError, OffloadError
from ._model.offload_model import OffloadModel
from ._params.offload_parameters import active_offloads
from ._scaler import LossScaler

__all__ = ["Engine"]

logger = logging.getLogger("offload")


def _scaler(loss_scale: float | str | LossScaler | None) -> LossScaler | None:
    if loss_scale is None or isinstance(loss_scale, LossScaler):
        return loss_scale
    if loss_scale == "dynamic":
        return LossScaler()
    if isinstance(loss_scale, int | float) and not isinstance(loss_scale, bool):
        return LossScaler(float(loss_scale), dynamic=False)
    raise OffloadConfigError(
        f"offload: loss_scale must be None, a number (static scale), 'dynamic' or a "
        f"LossScaler, got {loss_scale!r}."
    )


class Engine:
    """Runs backward and the optimizer step of ``model`` the same way on every backend.

    Example::

        engine = Engine(model, optimizer, gradient_accumulation_steps=4, loss_scale="dynamic")
        for x, y in batches:
            loss = criterion(engine(x), y)
            engine.backward(loss)
            engine.step()        # steps every 4th call

    Args:
        model: The model (plain, an :class:`offload.OffloadModel`, or one whose
            parameters :func:`offload.offload_parameters` offloaded).
        optimizer: The optimizer over its parameters; required by :meth:`backward`.
        gradient_accumulation_steps: Backward passes per optimizer step.
        backend: The backend or its name; ``None`` means :func:`accel.get_backend`.
        loss_scale: Loss scaling for float16: ``None`` (off), ``"dynamic"``, a number
            (static scale) or a :class:`offload.LossScaler`. The scaler works on host
            gradients; see :class:`offload.LossScaler`.
        gradient_clipping: Clip the gradients' total 2-norm to this value at each
            boundary, after unscaling (DeepSpeed's name); ``None`` or ``0`` turns it off.
            :attr:`grad_norm` holds the norm before clipping.
        lr_scheduler: Stepped after each optimizer step (an object with ``step()``,
            such as ``torch.optim.lr_scheduler.LambdaLR``).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        gradient_accumulation_steps: int = 1,
        backend: Accelerator | str | None = None,
        loss_scale: float | str | LossScaler | None = None,
        gradient_clipping: float | None = None,
        lr_scheduler: Any = None,
    ) -> None:
        steps = gradient_accumulation_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise OffloadConfigError(
                f"offload: gradient_accumulation_steps must be an int >= 1, got {steps!r}."
            )
        clip = gradient_clipping
        if clip is not None and (
            isinstance(clip, bool) or not isinstance(clip, int | float) or not clip >= 0
        ):
            raise OffloadConfigError(
                f"offload: gradient_clipping must be a number >= 0 (the largest gradient "
                f"norm; 0 or None turns clipping off), got {clip!r}."
            )
        if lr_scheduler is not None and not callable(getattr(lr_scheduler, "step", None)):
            raise OffloadConfigError(
                f"offload: lr_scheduler must have a step() method (a torch.optim.lr_scheduler "
                f"object), got {type(lr_scheduler).__name__}."
            )
        _check_optimizer(model, optimizer)
        self.model = model
        self.optimizer = optimizer
        self.gradient_accumulation_steps = steps
        self.backend = resolve_backend(backend)
        self.scaler = _scaler(loss_scale)
        self.gradient_clipping = float(clip) if clip else None
        self.lr_scheduler = lr_scheduler
        self.grad_norm: float | None = None
        self.micro_steps = 0
        self.global_steps = 0
        self.skipped_steps = 0
        self._since_boundary = 0
        self._forced_boundary = False
        self._backward_since_step = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the model's forward.

        Between accumulation boundaries a model with ``no_sync()`` (``torch.nn.parallel.
        DistributedDataParallel``) runs inside it, so gradients are all-reduced only at
        boundaries; the forward must therefore go through the engine.
        """
        with self._gradient_sync():
            return self.model(*args, **kwargs)

    def _gradient_sync(self) -> AbstractContextManager[Any]:
        no_sync = getattr(self.model, "no_sync", None)
        if no_sync is None or self.is_gradient_accumulation_boundary():
            return nullcontext()
        context: AbstractContextManager[Any] = no_sync()
        return context

    @property
    def loss_scale(self) -> float | None:
        """The current loss scale, or ``None`` without loss scaling."""
        return None if self.scaler is None else self.scaler.scale

    def is_gradient_accumulation_boundary(self) -> bool:
        """Whether the next :meth:`step` steps the optimizer."""
        return self._forced_boundary or self._since_boundary + 1 >= self.gradient_accumulation_steps

    def set_gradient_accumulation_boundary(self, is_boundary: bool = True) -> None:
        """Make the next :meth:`step` a boundary (or not) whatever the count says.

        For the last, incomplete accumulation of an epoch: call it before that step's
        forward (so a DDP model synchronises) and the step updates the weights with the
        gradients accumulated so far; the count starts again after it. The losses were
        divided by ``gradient_accumulation_steps`` all the same.
        """
        self._forced_boundary = bool(is_boundary)

    def backward(
        self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True
    ) -> torch.Tensor:
        """Back-propagate ``loss``, divided by the accumulation steps and loss-scaled.

        Args:
            loss: A scalar (one-element) tensor that requires grad.
            retain_graph: Passed to ``backward``.
            scale_wrt_gas: Divide the loss by ``gradient_accumulation_steps``.

        Returns:
            The loss divided by the accumulation steps (before loss scaling), which is
            what the gradients are the gradients of.

        Raises:
            offload.OffloadConfigError: No optimizer, or ``loss`` is not a scalar tensor
                that requires grad.
        """
        if self.optimizer is None:
            raise OffloadConfigError(
                "offload: Engine.backward needs an optimizer to accumulate gradients for; "
                "construct the engine with Engine(model, optimizer)."
            )
        if not isinstance(loss, torch.Tensor):
            raise OffloadConfigError(
                f"offload: Engine.backward needs the loss as a tensor, got {type(loss).__name__}."
            )
        if loss.numel() != 1:
            raise OffloadConfigError(
                f"offload: Engine.backward needs a scalar loss, got a tensor of shape "
                f"{tuple(loss.shape)}; reduce it first (loss.mean() or loss.sum())."
            )
        if not loss.requires_grad:
            raise OffloadConfigError(
                "offload: the loss passed to Engine.backward does not require grad (computed "
                "under torch.no_grad(), or from frozen parameters only)."
            )
        scaled = loss
        if scale_wrt_gas and self.gradient_accumulation_steps > 1:
            scaled = loss / self.gradient_accumulation_steps
        target = scaled if self.scaler is None else self.scaler.scale_loss(scaled)
        try:
            with self._gradient_sync():
                target.backward(retain_graph=retain_graph)
        except BaseException:
            self._recover()
            raise
        self._backward_since_step = True
        self.backend.mark_step()
        return scaled

    def step(self) -> bool:
        """Step the optimizer at an accumulation boundary; count the micro-step otherwise.

        Returns:
            Whether the optimizer stepped: ``False`` between boundaries, and at a
            boundary whose gradients overflowed under loss scaling (the step is skipped,
            a warning is logged on the ``offload`` logger and :attr:`skipped_steps`
            grows).

        Raises:
            offload.OffloadError: No :meth:`backward` ran since the previous step.
            offload.OffloadConfigError: The engine has no optimizer.
        """
        if not self._backward_since_step:
            raise OffloadError(
                "offload: Engine.step() was called without an Engine.backward(loss) since "
                "the previous step, so there are no new gradients to count or apply; call "
                "engine.backward(loss) before each engine.step()."
            )
        stepped = False
        if self.is_gradient_accumulation_boundary():
            if self.optimizer is None:
                raise OffloadConfigError(
                    "offload: Engine.step needs an optimizer; construct the engine with "
                    "Engine(model, optimizer)."
                )
            stepped = self._boundary(self.optimizer)
            self._since_boundary = 0
            self._forced_boundary = False
        else:
            self._since_boundary += 1
        self._backward_since_step = False
        self.micro_steps += 1
        return stepped

    def _boundary(self, optimizer: torch.optim.Optimizer) -> bool:
        self.backend.synchronize()
        parameters = [p for g in optimizer.param_groups for p in g["params"]]
        found_inf = False
        if self.scaler is not None:
            found_inf = self.scaler.unscale_(parameters)
        stepped = False
        if found_inf:
            assert self.scaler is not None
            self.skipped_steps += 1
            logger.warning(
                "offload: skipped optimizer step %d: gradients overflowed (inf/NaN) at "
                "loss scale %g; the next step uses a smaller scale.",
                self.global_steps,
                self.scaler.scale,
            )
        else:
            if self.gradient_clipping is not None:
                with_grads = [p for p in parameters if p.grad is not None]
                norm = torch.nn.utils.clip_grad_norm_(with_grads, self.gradient_clipping)
                self.grad_norm = float(norm)
            optimizer.step()
            if self.lr_scheduler is not None:
                self.lr_scheduler.step()
            stepped = True
        optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.update(found_inf)
        self.global_steps += 1
        self.backend.mark_step()
        return stepped

    def _recover(self) -> None:
        for module in self.model.modules():
            if isinstance(module, OffloadModel):
                module.recover()
        for handle in active_offloads(self.model):
            handle.recover()

    def __repr__(self) -> str:
        return (
            f"Engine(model={type(self.model).__name__}, gradient_accumulation_steps="
            f"{self.gradient_accumulation_steps}, loss_scale={self.loss_scale}, "
            f"micro_steps={self.micro_steps})"
        )


def _check_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
    """Raise ``OffloadConfigError`` if ``optimizer`` holds none of ``model``'s parameters."""
    if optimizer is None:
        return
    groups = getattr(optimizer, "param_groups", None)
    if not isinstance(groups, list):
        raise OffloadConfigError(
            f"offload: Engine needs a torch.optim.Optimizer (with param_groups), got "
            f"{type(optimizer).__name__}. Pass torch.optim.AdamW(model.parameters()) or the like."
        )
    held = {id(p) for group in groups for p in group.get("params", ())}
    own = [p for p in model.parameters()]
    if own and not any(id(p) in held for p in own):
        raise OffloadConfigError(
            f"offload: the optimizer holds none of the model's {len(own)} parameters (its "
            f"{len(held)} parameters belong to another model, or to a copy of this one), so "
            "Engine.step would update nothing the model uses. Build the optimizer from "
            "this model: optimizer = torch.optim.AdamW(model.parameters(), ...)."
        )
