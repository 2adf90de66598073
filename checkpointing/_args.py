"""Checks on what users pass to the public functions, with messages that say what to do."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

import accel
from accel import Accelerator, AccelError

__all__ = [
    "default_backend",
    "require_bool",
    "require_optional_bool",
    "resolve_backend",
    "validate_budget",
    "validate_planned",
]


def default_backend(values: Iterable[Any]) -> Accelerator:
    """Return the backend a checkpoint given no ``backend`` runs on.

    :func:`accel.get_backend`, unless the tensors among ``values`` live on a device
    that backend does not compute on (a backend selected by name only, such as
    a lazy runtime's host client, while auto-detection keeps ``cpu``): then the backend
    named after that device type, as torch's checkpoint infers the device from its
    inputs. Otherwise the generators replayed would not be the ones the function
    draws from. Falls back to :func:`accel.get_backend` where no such backend exists.
    """
    backend = accel.get_backend()
    others = {
        value.device.type
        for value in values
        if isinstance(value, torch.Tensor) and value.device.type not in ("cpu", "meta")
    } - {backend.device_type}
    if len(others) != 1:
        return backend
    (device_type,) = others
    try:
        named = accel.get_backend(device_type)
    except AccelError:
        return backend
    return named if named.device_type == device_type else backend


def resolve_backend(backend: Any, *, where: str = "backend") -> Accelerator | None:
    """Return the backend ``backend`` names, by :func:`accel.resolve_backend`'s rule.

    ``None`` stays ``None``: a checkpoint picks its backend when it runs, from its
    inputs' device (:func:`default_backend`), where :func:`accel.resolve_backend` would
    take :func:`accel.get_backend` now.

    Raises:
        accel.AccelTypeError: ``backend`` is neither ``None``, a name nor an object
            with every :class:`accel.Accelerator` member.
        accel.BackendNotFoundError, accel.BackendUnavailableError: For a name that is
            unknown or unusable here.
    """
    if backend is None:
        return None
    return accel.resolve_backend(backend, "checkpointing", where=where)


def require_bool(value: Any, name: str) -> bool:
    """Return ``value`` if it is a bool, else raise a ``TypeError`` naming ``name``."""
    if not isinstance(value, bool):
        raise TypeError(
            f"checkpointing: {name} must be True or False, got {value!r} "
            f"({type(value).__name__}). Pass a bool."
        )
    return value


def require_optional_bool(value: Any, name: str) -> bool | None:
    """Return ``value`` if it is a bool or ``None``, else raise a ``TypeError`` naming ``name``."""
    if value is not None and not isinstance(value, bool):
        raise TypeError(
            f"checkpointing: {name} must be True, False or None, got a "
            f"{type(value).__name__} ({value!r:.60}). Pass it by keyword: "
            f"{name}=False (recommended) or {name}=True."
        )
    return value


def validate_budget(memory_budget: Any) -> None:
    """Raise ``TypeError``/``ValueError`` unless ``memory_budget`` is a valid budget."""
    if isinstance(memory_budget, bool) or not isinstance(memory_budget, int | float):
        raise TypeError(
            "checkpointing: memory_budget must be a float fraction of the plain model's "
            "activation memory (0 < b <= 1) or an int number of bytes, not "
            f"{type(memory_budget).__name__} {memory_budget!r}."
        )
    if isinstance(memory_budget, float) and not 0.0 < memory_budget <= 1.0:
        raise ValueError(
            f"checkpointing: memory_budget={memory_budget!r} is out of range: a float is a "
            "fraction of the plain model's activation memory, 0 < b <= 1 (1.0 changes "
            "nothing). Pass, for example, 0.5; or an int for a number of bytes."
        )
    if isinstance(memory_budget, int) and memory_budget <= 0:
        raise ValueError(
            f"checkpointing: memory_budget={memory_budget} bytes is out of range: an int "
            "budget is a positive number of bytes of activation memory. Pass a positive "
            "int, or a float fraction 0 < b <= 1."
        )


def validate_planned(model: Any, example_inputs: Any) -> None:
    """Raise unless ``model`` and ``example_inputs`` describe a training step to plan.

    Raises:
        TypeError: ``model`` is not a module, or ``example_inputs`` is neither a tuple
            (or list) of positional arguments nor a dict of keyword arguments.
        ValueError: ``model`` is in evaluation mode.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"checkpointing: the model to plan must be a torch.nn.Module, got "
            f"{type(model).__name__}. Pass the model whose training step is to fit the budget."
        )
    if not isinstance(example_inputs, tuple | list | dict):
        kind = type(example_inputs).__name__
        raise TypeError(
            "checkpointing: example_inputs must be a tuple of the model's positional "
            f"arguments (or a dict of keyword arguments), got a {kind}. For a model "
            "called as model(x), pass example_inputs=(x,)."
        )
    if not model.training:
        raise ValueError(
            "checkpointing: the model is in evaluation mode (model.training is False), so "
            "the profiled step would skip dropout and use batch norm's running statistics: "
            "a plan made from it does not match a training step (its saved tensors and "
            "operator calls differ) and the memory it counts is not training's. Call "
            "model.train() before planning, and plan the step you will train."
        )
