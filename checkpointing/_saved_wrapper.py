"""``SavedTensorWrapper``: carries out a :class:`._saved_plan.SavedPlan` on one module.

Around the wrapped module's forward it installs saved-tensor hooks that count the
tensors autograd saves. At a planned position the tensor must be the view the profile
saw (shape, strides, offset, dtype, storage size, and the same storage wherever the
plan says so), since a recipe built for other tensors would not give the forward's
values. Planned tensors are then:

* kept and remembered (``"leaf"``): a recipe reads them in backward; their version
  counters are checked then, as autograd checks its own saved tensors;
* packed (``"pack"``): stored as booleans and one value; a tensor that turns out not
  to be two-valued is kept whole;
* dropped (``"drop"``): unpacking runs the recipe's calls again under ``no_grad`` and
  without autocast, and returns the saved view of the result. A storage saved at
  several positions is recomputed once, and dropped storages the recipe computed on the
  way are not computed again: they wait in a cache until their last planned unpack.

Every other saved tensor goes to the hooks that were active outside the module, if
any, unchanged. Under ``torch.compile``, where saved-tensor hooks cannot be traced, the
module runs as its plan's compiled form (``SavedPlan.compiled_as``: a whole or
selective checkpointed region, which the compiler honours, or the module as it is),
which the planner chose so that the plan's estimated bytes still hold.

The plan was made on a fake-tensor step, and a device's kernels may lay out or save
tensors otherwise than their fake counterparts. So the first call with inputs of the
planned shapes (and each later one whose inputs have other strides) is *checked*: every
tensor it would drop is kept meanwhile, and at the end of its forward each recipe runs
and its result is compared, bit for bit, with the tensor autograd saved. If every saved
tensor matched the plan and every recipe gave the saved values, the kept tensors are
released and the plan holds for such calls. Otherwise this call keeps its tensors (it
is exact, as the plain module) and later such calls are checkpointed whole, with one
warning that says why. The forward runs once either way (running statistics update
once). A call whose inputs have other shapes than the profiled ones raises
:class:`CheckpointError` at the first saved tensor that differs, with the generators put
back: the plan was made for other inputs.

Which tensors autograd saves depends on which inputs and parameters need grad (a
linear layer saves its weight only when its input needs grad). A call whose pattern
differs from the profiled one (inputs that need grad where the example inputs did not,
parameters frozen after planning) is checkpointed whole instead, with one warning per
wrapper: exact, and keeping less than the plan would.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

import accel
from accel import Accelerator

from ._caches import refuse_cache_arguments
from ._checkpoint import _user_stacklevel, run_checkpoint
from ._decisions import KEEP, SELECTIVE
from ._errors import CheckpointError
from ._saved_plan import SavedPlan, grad_pattern
from ._saved_run import PlanIndex, SavedRun
from ._selective import operator_class_contexts
from ._state import ForwardState
from ._steps import tensors_of as _tensors
from ._wrapper import CheckpointWrapper

__all__ = ["SavedTensorWrapper"]


def _layout(inputs: list[torch.Tensor]) -> tuple[Any, ...]:
    """What a checked call's verdict holds for: its inputs' shapes, strides and dtypes."""
    return tuple((tuple(t.shape), t.stride(), t.storage_offset(), t.dtype) for t in inputs)


class SavedTensorWrapper(CheckpointWrapper):
    """Runs ``module`` with a :class:`SavedPlan`: some saved tensors dropped or packed.

    Built by :meth:`CheckpointPlan.apply` for modules planned at the saved-tensor
    grain; nothing is checkpointed whole, so the forward runs once.
    """

    def __init__(
        self,
        module: nn.Module,
        plan: SavedPlan,
        *,
        backend: Accelerator | None = None,
        preserve_rng_state: bool = True,
    ) -> None:
        super().__init__(module, backend=backend, preserve_rng_state=preserve_rng_state)
        self.plan = plan
        self._index = PlanIndex(plan)
        self._warned = False
        self._warned_differs = False
        # Inputs' layout -> "" where a checked call matched the plan, else why not.
        self._verdicts: dict[tuple[Any, ...], str] = {}

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the wrapped module's forward with the plan's saved-tensor hooks.

        Under ``torch.compile`` it runs as the plan's compiled form instead
        (:meth:`_compiled`); around a module dynamo cannot trace (an RNN), as here,
        outside the graph.
        """
        if torch.compiler.is_compiling():
            if not self._traced:
                return self._outside_graph(*args, **kwargs)
            return self._compiled(args, kwargs)
        if not torch.is_grad_enabled():
            return self.module(*args, **kwargs)
        inputs = _tensors((args, kwargs))
        grads = self.plan.grads
        if grads is not None and grad_pattern(self.module, inputs) != grads:
            self._warn_whole()
            return super().forward(*args, **kwargs)
        layout = _layout(inputs)
        verdict = self._verdicts.get(layout)
        if verdict:
            return super().forward(*args, **kwargs)
        shapes = self.plan.input_shapes
        planned = shapes is None or shapes == tuple(tuple(t.shape) for t in inputs)
        return self._hooked(args, kwargs, inputs, layout if verdict is None and planned else None)

    def _compiled(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The module as the plan's compiled form (``plan.compiled_as``).

        Saved-tensor hooks cannot be traced, and without them the compiler keeps whatever
        its partitioner chooses, up to everything the module saves: the form is a
        checkpointed region of the compiled graph, whole or selective, or the module as
        it is where the planner found that its plain saved tensors fit.
        """
        if not torch.is_grad_enabled() or self.plan.compiled_as == KEEP:
            return self.module(*args, **kwargs)
        refuse_cache_arguments(self.module, args, kwargs)
        selective = self.plan.compiled_as == SELECTIVE
        return run_checkpoint(
            self.module,
            args,
            kwargs,
            use_reentrant=False,
            preserve_rng_state=self.preserve_rng_state,
            backend=self._backend_ref.get(),
            context_fn=operator_class_contexts if selective else None,
        )

    def _warn_whole(self) -> None:
        if self._warned:
            return
        self._warned = True
        warnings.warn(
            f"checkpointing: {self.plan.module or 'the model'!r} was planned at the "
            "saved-tensor grain with example inputs whose need for grad differs from this "
            "call's (an input needs grad here, or a parameter was frozen or unfrozen since "
            "planning), so autograd saves other tensors than the plan lists. This call is "
            "checkpointed whole instead: exact, keeping less memory, recomputing more. To "
            "keep the plan, pass plan_checkpointing example inputs that need grad exactly "
            "as the training inputs do.",
            UserWarning,
            stacklevel=_user_stacklevel(),
        )

    # Run eagerly as a whole even inside a compiled caller's eager fallback: were the
    # module's own frames compiled, its saved tensors would not be the planned ones.
    @torch.compiler.disable  # type: ignore[untyped-decorator]
    def _hooked(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        inputs: list[torch.Tensor],
        checked: tuple[Any, ...] | None = None,
    ) -> Any:
        run = SavedRun(self._index, self.module, inputs, checking=checked is not None)
        state = ForwardState.capture(self._backend_ref.get() or accel.get_backend(), True, inputs)
        try:
            with torch.autograd.graph.saved_tensors_hooks(run.pack, run.unpack):
                output = self.module(*args, **kwargs)
        except CheckpointError:
            state.restore_rng()
            raise
        if checked is not None:
            self._verdicts[checked] = reason = run.check()
            if reason:
                self._warn_differs(reason)
        return output

    def _warn_differs(self, reason: str) -> None:
        if self._warned_differs:
            return
        self._warned_differs = True
        warnings.warn(
            f"checkpointing: {self.plan.module or 'the model'!r} was planned at the "
            "saved-tensor grain on a fake-tensor step, but its real forward on these "
            f"inputs saves other tensors than the plan lists ({reason}): this device lays "
            "out or saves tensors otherwise than the fake profile. Such calls are "
            "checkpointed whole instead: exact, keeping less memory, recomputing more.",
            UserWarning,
            stacklevel=_user_stacklevel(),
        )

    def extra_repr(self) -> str:
        return self.plan.summary
