"""Which calls of a per-call module run inside another call the plan wraps.

A plan names module calls (``"name@k"`` where a module runs several times per step).
Where a planned call (ALBERT's layer group, checkpointed whole) makes calls of a module
that is planned call by call elsewhere (the layer's activation), those inner calls run
inside the outer call's region. :func:`enclosed_calls` finds them in the profile's call
tree, so that :meth:`CheckpointPlan.apply` can leave them uncounted
(:class:`checkpointing.PerCallWrapper`): no wrapper then changes Python state inside a
checkpointed region, which ``torch.compile`` would answer with a graph break.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ._records import ModuleProfile

__all__ = ["Enclosed", "enclosed_calls"]

#: For each planned call that encloses calls of per-call modules: each such module and
#: the calls of it (their numbers in the step) made inside.
Enclosed = dict[str, dict[str, tuple[int, ...]]]


def enclosed_calls(
    modules: Mapping[str, ModuleProfile], chosen: Iterable[str], calls: Mapping[str, int]
) -> Enclosed:
    """The calls of the modules in ``calls`` that run inside a ``chosen`` call.

    Args:
        modules: The profile's module calls by name, each with its children's names.
        chosen: The planned calls (the root, ``""``, encloses everything and is left out:
            a plan that wraps the root wraps nothing else).
        calls: The modules planned call by call, with their calls per step.

    Returns:
        The enclosing calls, in ``chosen``'s order, each with the enclosed modules'
        calls, sorted.
    """
    found: Enclosed = {}
    for name in chosen:
        if not name:
            continue
        inside: dict[str, list[int]] = {}
        below = list(modules[name].children)
        while below:
            record = modules[below.pop()]
            if record.module in calls:
                inside.setdefault(record.module, []).append(record.call)
            below.extend(record.children)
        if inside:
            found[name] = {module: tuple(sorted(inside[module])) for module in sorted(inside)}
    return found
