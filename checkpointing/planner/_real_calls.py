"""One real forward's module calls, held against the fake step's before anything is planned.

A library may branch on whether a tensor is fake. transformers builds its attention mask
whenever the padding mask is a ``FakeTensor``, whose values it cannot read, and skips it
in a real forward where no position is padded: on fake tensors each decoder layer
receives a mask that it never receives in training, and saves other tensors. A grain that
relies on the recorded saved tensors or operator occurrences (the saved-tensor grain, the
selective ones) would meet another list at its first real call and fall back to
checkpointing the call whole, slower than planned.

:func:`real_inputs` runs the model's forward once for real, without grad (autograd saves
nothing, so it holds a forward's passing tensors, not its activations), with the
generators, buffers and gradients put back, and records each module call's tensor
inputs. :func:`unlike_real` names every fake call whose inputs differ from the real
call's in number or shape, with the calls that enclose it; the planner offers those calls
only grains that do not rely on the recording (a whole checkpoint), and the plan's note
names them. On a lazy device nothing runs: a real forward there would trace and compile a
graph, which planning never does; nor where the model's tensors are not on the backend's
device (a profile made for another device), nor for a model whose forward runs
collectives (FSDP2, DDP, DTensor: planning runs on rank 0 alone).
"""

from __future__ import annotations

from collections import Counter
from contextlib import ExitStack
from typing import Any

import torch
from torch import nn

from accel import Accelerator

from .._steps import call_model, tensors_of, untouched
from ._leftovers import leaving_nothing
from ._records import ModuleProfile, call_name

__all__ = ["real_inputs", "unlike_real", "unlike_real_note"]

Shapes = tuple[tuple[int, ...], ...]


def real_inputs(model: nn.Module, example_inputs: Any, backend: Accelerator) -> dict[str, Shapes]:
    """Each module call's tensor input shapes in one real forward without grad, by call name.

    Calls are named as the profile names them (``"name@k"`` for a module called more
    than once). The model's gradients, buffers and the backend's generators are left as
    they were.
    """
    names = {id(module): name for name, module in model.named_modules()}
    counts: Counter[str] = Counter()
    seen: list[tuple[str, int, Shapes]] = []

    def before(module: nn.Module, args: Any, kwargs: Any) -> None:
        name = names.get(id(module))
        if name is not None:
            shapes = tuple(tuple(tensor.shape) for tensor in tensors_of((args, kwargs)))
            seen.append((name, counts[name], shapes))
            counts[name] += 1

    with ExitStack() as stack:
        for module in model.modules():
            hook = module.register_forward_pre_hook(before, with_kwargs=True)
            stack.callback(hook.remove)
        stack.enter_context(untouched(model, backend))
        stack.enter_context(leaving_nothing(model, fake=False))
        stack.enter_context(torch.no_grad())
        call_model(model, example_inputs)
    return {call_name(name, call, counts[name]): shapes for name, call, shapes in seen}


def unlike_real(modules: dict[str, ModuleProfile], real: dict[str, Shapes]) -> tuple[str, ...]:
    """The fake calls whose tensor inputs differ from the real forward's, and their callers.

    A call the real forward makes and the fake step does not (or the other way round)
    counts as differing; so does each call that encloses a differing one, whose saved
    tensors include the differing call's. Each named record gets ``unlike_real`` set.
    """
    parent = {child: name for name, record in modules.items() for child in record.children}
    differing = [name for name, record in modules.items() if real.get(name) != record.input_shapes]
    # A call only the real forward makes: its enclosing calls are those of its module's
    # path (the fake step has no record of the call itself).
    for name in real:
        if name not in modules:
            path = name.split("@")[0]
            differing += [
                record_name
                for record_name, record in modules.items()
                if path.startswith(f"{record.module}.") or not record.module
            ]
    marked: set[str] = set()
    for name in differing:
        current: str | None = name
        while current is not None and current not in marked:
            marked.add(current)
            current = parent.get(current)  # None above the root
    for name in marked:
        modules[name].unlike_real = True
    return tuple(sorted(marked))


def unlike_real_note(names: tuple[str, ...]) -> str:
    """The plan's note on calls whose real inputs differ from the fake step's."""
    shown = ", ".join(repr(name) for name in names[:4] if name)
    more = f" and {len(names) - 4} more" if len(names) > 4 else ""
    return (
        f"{len(names)} module call(s) ({shown}{more}) get other tensor inputs in a real "
        "forward than on fake tensors (a library that branches on fake tensors, such as "
        "transformers' attention masks), so they are planned only at grains that do not "
        "rely on the recorded saved tensors."
    )
