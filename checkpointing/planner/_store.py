"""Plans as JSON: the parts of a :class:`CheckpointPlan` that are not plain values.

A saved plan is meant to be read, reviewed and kept under version control, so every
value is written as itself where JSON has it (names, bytes, seconds, lists) and tagged
where it does not: ``{"dtype": "float32"}``, ``{"device": "cpu"}``, ``{"tuple": [...]}``,
a recorded tensor argument as ``{"ref": ...}`` with its view of the storage. Operators
are written by name (``"aten.mul.Tensor"``) and looked up in ``torch.ops`` on loading.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .._decisions import FULL
from .._replay import Geometry, Ref
from .._saved_plan import ReplayStep, SavedPlan, operator_named

__all__ = ["PlanFormatError", "decode_saved_plan", "encode_saved_plan", "operator"]


class PlanFormatError(ValueError):
    """A saved plan that cannot be read back (raised as ``ValueError``)."""


def operator(name: str) -> Any:
    """The aten operator overload named ``name`` (``"aten.mul.Tensor"``)."""
    try:
        return operator_named(name)
    except AttributeError:
        raise PlanFormatError(
            f"checkpointing: the saved plan names the operator {name!r}, which this torch "
            f"({torch.__version__}) does not have. Plan again with this torch."
        ) from None


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise PlanFormatError(
            f"checkpointing: the saved plan names the dtype {name!r}, which torch does not "
            "have. Plan again with this torch."
        )
    return dtype


def _geometry(g: Geometry) -> list[Any]:
    return [
        list(g.size),
        list(g.stride),
        g.offset,
        str(g.dtype).removeprefix("torch."),
        g.storage_bytes,
    ]


def _from_geometry(value: list[Any]) -> Geometry:
    size, stride, offset, dtype, storage = value
    return Geometry(tuple(size), tuple(stride), int(offset), _dtype(dtype), int(storage))


def encode(value: Any) -> Any:
    """``value`` (an operator's recorded arguments) as JSON values."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, Ref):
        return {"ref": [value.kind, value.key, _geometry(value.geometry)]}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).removeprefix("torch.")}
    if isinstance(value, torch.layout):
        return {"layout": str(value).removeprefix("torch.")}
    if isinstance(value, tuple):
        return {"tuple": [encode(v) for v in value]}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {"dict": {str(k): encode(v) for k, v in value.items()}}
    raise PlanFormatError(
        f"checkpointing: a recorded operator argument of type {type(value).__name__} "
        "cannot be written to JSON. Save plans without the saved-tensor grain for this "
        "model (plan_checkpointing(..., selective=False) keeps whole modules only)."
    )


def decode(value: Any) -> Any:
    """The inverse of :func:`encode`."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    ((tag, inner),) = value.items()
    if tag == "float":
        return float(inner)
    if tag == "ref":
        kind, key, geometry = inner
        return Ref(kind, key, _from_geometry(geometry))
    if tag == "dtype":
        return _dtype(inner)
    if tag == "device":
        return torch.device(inner)
    if tag in ("memory_format", "layout"):
        return getattr(torch, inner)
    if tag == "tuple":
        return tuple(decode(v) for v in inner)
    if tag == "dict":
        return {k: decode(v) for k, v in inner.items()}
    raise PlanFormatError(f"checkpointing: unknown tag {tag!r} in a saved plan.")


def encode_saved_plan(plan: SavedPlan) -> dict[str, Any]:
    """One module's saved-tensor plan as JSON values."""
    return {
        "module": plan.module,
        "summary": plan.summary,
        "positions": {str(p): [a, s] for p, (a, s) in plan.positions.items()},
        "geometries": {str(p): _geometry(g) for p, g in plan.geometries.items()},
        "recipes": {
            str(storage): [
                {"op": step.name, "args": encode(step.template), "outputs": list(step.outputs)}
                for step in steps
            ]
            for storage, steps in plan.recipes.items()
        },
        "inputs": {str(s): p for s, p in plan.inputs.items()},
        "grads": None if plan.grads is None else list(plan.grads),
        "compiled_as": plan.compiled_as,
        "input_shapes": None if plan.input_shapes is None else [list(s) for s in plan.input_shapes],
    }


def decode_saved_plan(value: dict[str, Any]) -> SavedPlan:
    """The inverse of :func:`encode_saved_plan`."""
    return SavedPlan(
        module=value["module"],
        positions={int(p): (a, int(s)) for p, (a, s) in value["positions"].items()},
        geometries={int(p): _from_geometry(g) for p, g in value["geometries"].items()},
        recipes={
            int(storage): tuple(
                ReplayStep(
                    step["op"], operator(step["op"]), decode(step["args"]), tuple(step["outputs"])
                )
                for step in steps
            )
            for storage, steps in value["recipes"].items()
        },
        inputs={int(s): int(p) for s, p in value["inputs"].items()},
        summary=value["summary"],
        grads=None if value.get("grads") is None else tuple(value["grads"]),
        # Plans saved before it was recorded run as a whole-module region under compile.
        compiled_as=str(value.get("compiled_as", FULL)),
        input_shapes=(
            None
            if value.get("input_shapes") is None
            else tuple(tuple(int(n) for n in shape) for shape in value["input_shapes"])
        ),
    )
