"""``checkpoint_sequential``: checkpoint a chain of modules segment by segment."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from ._args import require_optional_bool, resolve_backend
from ._checkpoint import run_checkpoint, warn_missing_use_reentrant

__all__ = ["checkpoint_sequential"]


def _run_segment(
    functions: Sequence[Callable[..., Any]], start: int, end: int
) -> Callable[..., Any]:
    def run(value: Any) -> Any:
        for function in functions[start:end]:
            value = function(value)
        return value

    return run


def checkpoint_sequential(
    functions: nn.Sequential | Sequence[Callable[..., Any]],
    segments: int,
    input: Any,
    use_reentrant: bool | None = None,
    **kwargs: Any,
) -> Any:
    """Run ``functions`` in order, checkpointing all segments but the last.

    A drop-in replacement for :func:`torch.utils.checkpoint.checkpoint_sequential`:
    the functions are split into ``segments`` runs of ``len(functions) // segments``
    (the last run takes the rest); each run but the last is a :func:`checkpoint`,
    whose input is all it keeps for backward. The last run keeps its activations, as
    backward needs them first.

    Example::

        from checkpointing import checkpoint_sequential

        out = checkpoint_sequential(model, 4, x, use_reentrant=False)

    Args:
        functions: An :class:`torch.nn.Sequential` or a sequence of modules or
            functions, each taking one value and returning one.
        segments: How many segments to split ``functions`` into, from 1 to its length.
        input: The first function's input.
        use_reentrant: Which checkpoint variant to use. ``None`` (the default) gives
            the installed torch's warning and then the reentrant variant, as torch
            does.
        **kwargs: ``preserve_rng_state`` (default ``True``) and ``backend`` (a backend
            or its name; default :func:`accel.get_backend`), as for :func:`checkpoint`.

    Returns:
        The last function's output.

    Raises:
        ValueError: For any other keyword argument (torch's wording), or a
            ``segments`` outside ``1..len(functions)``.
    """
    require_optional_bool(use_reentrant, "use_reentrant")
    if use_reentrant is None:
        warn_missing_use_reentrant(sequential=True)
    preserve_rng_state = bool(kwargs.pop("preserve_rng_state", True))
    backend = resolve_backend(kwargs.pop("backend", None))
    if kwargs:
        raise ValueError("Unexpected keyword arguments: " + ",".join(arg for arg in kwargs))
    if isinstance(functions, nn.Sequential):
        functions = list(functions.children())
    functions = list(functions)
    if isinstance(segments, bool) or not isinstance(segments, int):
        raise ValueError(
            f"checkpointing: segments must be an int, got {segments!r} "
            f"({type(segments).__name__}). Pass how many checkpointed segments you want."
        )
    if not 1 <= segments <= len(functions):
        raise ValueError(
            f"checkpointing: segments must be between 1 and the number of functions "
            f"({len(functions)}), got {segments}. Pass fewer segments or more functions."
        )
    reentrant = True if use_reentrant is None else bool(use_reentrant)
    size = len(functions) // segments
    end = 0
    for start in range(0, size * (segments - 1), size):
        end = start + size
        input = run_checkpoint(
            _run_segment(functions, start, end),
            (input,),
            {},
            use_reentrant=reentrant,
            preserve_rng_state=preserve_rng_state,
            backend=backend,
        )
    return _run_segment(functions, end, len(functions))(input)
