"""One real forward's module calls, held against the fake step's before anything is planned.

A library may branch on whether a tensor is fake. transformers builds its attention mask
whenever the padding mask is a ``FakeTensor``, whose values it cannot read, and skips it
in a real forward where no position is padded: on fake tensors each decoder layer would
receive a mask that it never receives in training, and save other tensors. A grain that
relies on the recorded saved tensors or operator occurrences (the saved-tensor grain, the
selective ones) would meet another list at its first real call and fall back to
checkpointing the call whole, slower than planned.

:func:`real_calls` runs the model's forward once for real, without grad (autograd saves
nothing, so it holds a forward's passing tensors, not its activations), with the
generators, buffers and gradients put back, before the fake step. It records each module
call's tensor input shapes and which of its arguments are ``None``. The fake step then
calls each module as the real forward did (:meth:`RealCalls.align`): an argument the
real call leaves ``None`` and the fake one fills with a tensor (the mask) is passed as
``None``, so the call is profiled on the real forward's branch, and the plan's note
names it. The caller's own operators that built the mask stay in its record; they are
few and cheap.

Differences that cannot be aligned remain: :func:`unlike_real` names every fake call
whose tensor inputs still differ from the real call's in number or shape, with the calls
that enclose it; the planner offers those calls only grains that do not rely on the
recording (a whole checkpoint), and the plan's note names them. On a lazy device nothing
runs: a real forward there would trace and compile a graph, which planning never does;
nor where the model's tensors are not on the backend's device (a profile made for
another device), nor for a model whose forward runs collectives (FSDP2, DDP, DTensor:
planning runs on rank 0 alone).
"""

from __future__ import annotations

from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from accel import Accelerator

from .._steps import call_model, tensors_of, untouched
from ._leftovers import leaving_nothing
from ._records import ModuleProfile, call_name

__all__ = [
    "RealCall",
    "RealCalls",
    "aligned_note",
    "real_calls",
    "unlike_real",
    "unlike_real_note",
]

Shapes = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class RealCall:
    """One module call of the real forward: its tensor input shapes and its arguments.

    ``positional`` is how many positional arguments it got, ``keywords`` the keyword
    arguments' names, and ``left_none`` the positions (``int``) and keywords (``str``)
    it got as ``None``.
    """

    shapes: Shapes
    positional: int
    keywords: frozenset[str]
    left_none: frozenset[int | str]


@dataclass
class RealCalls:
    """The real forward's module calls, by module name and call (0 for the first)."""

    calls: dict[tuple[str, int], RealCall] = field(default_factory=dict)

    def shapes(self) -> dict[str, Shapes]:
        """Each call's tensor input shapes, by the profile's call name (``"name@k"``)."""
        counts = Counter(name for name, _ in self.calls)
        return {
            call_name(name, call, counts[name]): real.shapes
            for (name, call), real in self.calls.items()
        }

    def align(
        self, name: str, call: int, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any], tuple[str, ...]]:
        """``args`` and ``kwargs`` with a ``None`` wherever the real call had one.

        Only a tensor is replaced, and only where the real call got the same positional
        count and keywords. Returns the arguments and the names of those replaced
        (a keyword's name, or ``"argument i"``).
        """
        real = self.calls.get((name, call))
        if real is None or real.positional != len(args) or real.keywords != set(kwargs):
            return args, kwargs, ()
        given: list[tuple[int | str, Any]] = [*enumerate(args), *kwargs.items()]
        left = [
            key for key, value in given if key in real.left_none and isinstance(value, torch.Tensor)
        ]
        if not left:
            return args, kwargs, ()
        return (
            tuple(None if i in left else value for i, value in enumerate(args)),
            {key: None if key in left else value for key, value in kwargs.items()},
            tuple(key if isinstance(key, str) else f"argument {key}" for key in left),
        )


def real_calls(model: nn.Module, example_inputs: Any, backend: Accelerator) -> RealCalls:
    """Each module call of one real forward without grad (see the module docstring).

    The model's gradients, buffers and the backend's generators are left as they were.
    """
    names = {id(module): name for name, module in model.named_modules()}
    seen = RealCalls()
    counts: Counter[str] = Counter()

    def before(module: nn.Module, args: Any, kwargs: Any) -> None:
        name = names.get(id(module))
        if name is None:
            return
        left_none: set[int | str] = {i for i, value in enumerate(args) if value is None}
        left_none.update(key for key, value in kwargs.items() if value is None)
        shapes = tuple(tuple(tensor.shape) for tensor in tensors_of((args, kwargs)))
        real = RealCall(shapes, len(args), frozenset(kwargs), frozenset(left_none))
        seen.calls[name, counts[name]] = real
        counts[name] += 1

    with ExitStack() as stack:
        for module in model.modules():
            hook = module.register_forward_pre_hook(before, with_kwargs=True)
            stack.callback(hook.remove)
        stack.enter_context(untouched(model, backend))
        stack.enter_context(leaving_nothing(model, fake=False))
        stack.enter_context(torch.no_grad())
        call_model(model, example_inputs)
    return seen


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


def _named(names: tuple[str, ...]) -> str:
    shown = ", ".join(repr(name) for name in names[:4] if name)
    more = f" and {len(names) - 4} more" if len(names) > 4 else ""
    return f"{len(names)} module call(s) ({shown}{more})"


def unlike_real_note(names: tuple[str, ...]) -> str:
    """The plan's note on calls whose real inputs differ from the fake step's."""
    return (
        f"{_named(names)} get other tensor inputs in a real forward than on fake tensors "
        "(a library that branches on fake tensors), so they are planned only at grains "
        "that do not rely on the recorded saved tensors."
    )


def aligned_note(aligned: dict[str, tuple[str, ...]]) -> str:
    """The plan's note on calls profiled with the real forward's ``None`` arguments."""
    arguments = sorted({argument for replaced in aligned.values() for argument in replaced})
    return (
        f"{_named(tuple(sorted(aligned)))} get a tensor on fake tensors where a real "
        f"forward passes None ({', '.join(arguments)}: transformers builds its attention "
        "masks on fake tensors), so they were profiled as the real forward calls them."
    )
