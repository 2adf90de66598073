"""``offload_parameters``: keep any model's parameters in host memory, load them per module.

Each chosen submodule becomes a *unit* whose own parameters are packed into page-locked
host memory; hooks load a unit when its module runs, through one of the two strategies
behind the handle (:mod:`offload._params.handle`), named by
:func:`offload._core.strategy.choose`: :mod:`offload._params.swap` swaps ``.data``,
:mod:`offload._params.copied` loads differentiable copies. A
parameter used by several chosen modules (tied weights: an embedding shared with the
output projection) is packed once, in a *group* of its own, which every module using
it loads while it runs; its gradient is the sum over its uses, accumulated on the device
exactly as without offload.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn

from accel import Accelerator

from .._core import strategy, transfer
from .._core.copies import require_host
from .._core.storage import SliceStorage, pack_in_blocks
from .._core.transfer import Transfers, resolve_backend, resolve_device
from .._errors import OffloadConfigError
from .._state import StateMachine
from .copied import CopyParameters
from .handle import ParameterOffload, active_offloads, offloaded_roots
from .swap import SwapData
from .units import Unit

__all__ = ["ParameterOffload", "active_offloads", "offload_parameters"]


def _names(root: nn.Module) -> dict[int, str]:
    return {id(module): name or "<root>" for name, module in root.named_modules()}


def _default_units(module: nn.Module) -> list[tuple[nn.Module, list[nn.Parameter]]]:
    units = []
    for submodule in module.modules():
        direct = list(submodule.parameters(recurse=False))
        if direct:
            units.append((submodule, direct))
    return units


def _build_units(
    module: nn.Module,
    chosen: Sequence[tuple[nn.Module, list[nn.Parameter]]],
    transfers: Transfers,
    *,
    copy: bool,
) -> list[Unit]:
    """Make one unit per chosen module and one group per set of shared parameters."""
    names = _names(module)
    users: dict[int, list[int]] = {}
    by_id: dict[int, nn.Parameter] = {}
    for position, (_, params) in enumerate(chosen):
        for parameter in params:
            by_id[id(parameter)] = parameter
            positions = users.setdefault(id(parameter), [])
            if position not in positions:
                positions.append(position)
    shared: dict[tuple[int, ...], list[nn.Parameter]] = {}
    for key, positions in users.items():
        if len(positions) > 1:
            shared.setdefault(tuple(positions), []).append(by_id[key])
    units: list[Unit] = []
    for position, (unit_module, params) in enumerate(chosen):
        own = [p for p in params if len(users[id(p)]) == 1]
        label = f"module {names.get(id(unit_module), '?')!r} ({type(unit_module).__name__})"
        storage = SliceStorage(
            position, label, [unit_module], own, [], transfers, copy=copy, allocate=False
        )
        units.append(Unit(position, unit_module, storage, StateMachine(label)))
    for users_of, params in shared.items():
        index = len(units)
        modules = ", ".join(repr(names.get(id(chosen[k][0]), "?")) for k in users_of)
        label = f"parameters shared by modules {modules}"
        storage = SliceStorage(index, label, [], params, [], transfers, copy=copy, allocate=False)
        group = Unit(index, None, storage, StateMachine(label))
        units.append(group)
        for position in users_of:
            units[position].groups.append(group)
    if copy:
        pack_in_blocks([unit.storage for unit in units], transfers)
    return units


def offload_parameters(
    module: nn.Module,
    *,
    prefetch: int = 1,
    backend: Accelerator | str | None = None,
    device: torch.device | str | None = None,
    modules: Iterable[nn.Module] | None = None,
) -> ParameterOffload:
    """Keep ``module``'s parameters in host memory and load each submodule's when it runs.

    Works for any model (branches, skip connections, shared submodules called twice, tied
    weights), also inside reentrant checkpoints. Buffers, and parameters outside the
    chosen submodules, move to the device. Gradients are copied to the host as they are
    accumulated, so an optimizer over ``module.parameters()`` steps on the host once
    ``backward`` returns. Feed the model inputs on the device. Offloading stays in force
    until :meth:`ParameterOffload.remove`, whether or not the handle is kept
    (:meth:`ParameterOffload.of` gets it back from the model).

    Example::

        handle = offload_parameters(model, prefetch=2)
        loss = model(x.to(handle.device)).sum()
        loss.backward()
        optimizer.step()
        handle.remove()          # the model is exactly as before, with its new weights

    Args:
        module: The model.
        prefetch: How many submodules ahead (in forward) or behind (in backward) to load
            while the current one computes; 0 loads each one when it is needed.
        backend: The backend or its name; ``None`` means :func:`accel.get_backend`.
        device: Where to compute; ``None`` means ``backend.device()``.
        modules: The submodules whose parameters to offload, each as a whole. Default:
            every submodule that owns parameters directly, each with those parameters.
            A parameter in several of them (tied weights) is loaded with each.

    Returns:
        The handle: :meth:`ParameterOffload.remove`, :meth:`ParameterOffload.recover`,
        and read-only state for monitoring.

    Raises:
        offload.OffloadConfigError: A bad ``prefetch`` or ``backend``, an unusable
            device, or ``module`` already offloaded.
    """
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
        raise OffloadConfigError(
            f"offload: prefetch must be an int >= 0 (how many modules to load ahead), got "
            f"{prefetch!r}; pass prefetch=1 (the default) or 0 to load each when it runs."
        )
    if not isinstance(module, nn.Module):
        raise OffloadConfigError(
            f"offload: offload_parameters needs an nn.Module, got {type(module).__name__}; "
            "pass the model itself."
        )
    roots = offloaded_roots()
    inside = any(any(m is module for m in root.modules()) for root in roots)
    if inside or active_offloads(module):
        raise OffloadConfigError(
            "offload: this module (or a submodule) already has its parameters offloaded; "
            "call remove() on the existing handle first (ParameterOffload.of(model) finds it)."
        )
    backend = resolve_backend(backend)
    compute_device = resolve_device(device, backend)
    if modules is None:
        chosen = _default_units(module)
    else:
        chosen = [(m, list(m.parameters())) for m in modules]
    handle = ParameterOffload(module, backend=backend, device=compute_device, prefetch=prefetch)
    if strategy.choose(compute_device) == strategy.COPY_PARAMETERS:
        require_host(module, compute_device)
        names = _names(module)
        labelled = [
            (f"module {names.get(id(m), '?')!r} ({type(m).__name__})", m, params)
            for m, params in chosen
        ]
        copies = CopyParameters(
            module, labelled, prefetch=prefetch, backend=backend, device=compute_device, keep=handle
        )
        return handle.start(copies, strategy.COPY_PARAMETERS)
    copy = transfer.copies_needed(compute_device, torch.device("cpu"))
    covered = {id(p) for _, params in chosen for p in params}
    origins: list[tuple[torch.Tensor, torch.device, tuple[int, ...]]] = [
        (t, t.device, t.stride()) for t in [*module.parameters(), *module.buffers()]
    ]
    transfers = Transfers(backend)
    units = _build_units(module, chosen, transfers, copy=copy)
    if copy:
        with torch.no_grad():
            for tensor, _, _ in origins:
                if id(tensor) not in covered and tensor.device != compute_device:
                    tensor.data = tensor.data.to(compute_device)
    swap = SwapData(
        module,
        units,
        prefetch=prefetch,
        backend=backend,
        device=compute_device,
        transfers=transfers,
        copy=copy,
        origins=origins,
        keep=handle,
    )
    return handle.start(swap, strategy.SWAP_DATA)
