"""Differences between the torch releases accel supports (2.4 to 2.15), in one place.

Each entry names the release that changed what it papers over. Code elsewhere imports
from here instead of comparing version numbers, so an old release can be dropped by
deleting its entry. This module imports torch: only modules that already need torch
import it (``import accel`` does not).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, cast

import torch
import torch.utils.checkpoint

__all__ = [
    "CHECKPOINT_TAKES_EARLY_STOP",
    "CHECKPOINT_TAKES_RESPECT_HOOKS",
    "DEVICE_BACKENDS_AUTOLOAD",
    "EFFICIENT_ATTENTION_TAKES_GQA",
    "PRIVATEUSE1_DEFAULT_NAME",
    "REENTRANT_OPTIONS_MESSAGE",
    "SAVED_TENSORS_HOOKS_VISIBLE",
    "accelerator_function",
    "checkpoint_debug_leaks_on_error",
    "checkpoint_early_stop",
    "checkpoint_supports_vmap",
    "compiled_plans_unavailable",
    "current_saved_tensors_hooks",
    "default_communication_backend",
    "graph_exec_group",
    "grouped_mm_fake_output",
    "keep_selective_cache_outside_hooks",
    "missing_use_reentrant_warning",
    "pin_memory",
    "post_accumulate_hooks_run_without_gradient",
    "privateuse1_device_type",
    "selective_cache_allows_mutation",
    "selective_checkpoint_api",
    "selective_contexts",
    "sdp_priority_order",
    "sole_owner",
    "torch_release",
]


def torch_release() -> tuple[int, int]:
    """Return the installed torch's (major, minor), e.g. ``(2, 4)`` for ``2.4.1+cu121``."""
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


# FSDP2 off CUDA: torch 2.4 and 2.5 create torch.cuda streams whatever the mesh's device
# ("CUDA driver version is insufficient" on a gloo/CPU mesh); 2.6 takes the mesh's device,
# but its CPU stream lacks record_event ("'Stream' object has no attribute 'record_event'"),
# which pytorch/pytorch#145935 added for 2.7. Seen failing here with 2.4.1 and 2.6.0,
# passing with 2.13.0 and 2.15.0.
FSDP2_MIN_RELEASE_OFF_CUDA = (2, 7)

# torch 2.6 made FSDP2 public as torch.distributed.fsdp.fully_shard; 2.4 and 2.5 ship the
# same function as torch.distributed._composable.fsdp.fully_shard.
_FULLY_SHARD_MODULES = ("torch.distributed.fsdp", "torch.distributed._composable.fsdp")


def fsdp2_fully_shard() -> Callable[..., Any]:
    """Return FSDP2's ``fully_shard`` from wherever this torch release keeps it.

    Raises:
        ImportError: This torch build has no FSDP2 (built without distributed support).
    """
    for module_name in _FULLY_SHARD_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        function = getattr(module, "fully_shard", None)
        if callable(function):
            return cast("Callable[..., Any]", function)
    raise ImportError(
        f"torch {torch.__version__} has no FSDP2 fully_shard (looked in "
        f"{' and '.join(_FULLY_SHARD_MODULES)}): it needs torch 2.4 or newer built with "
        "distributed support (torch.distributed.is_available()). Install such a build, "
        "or use DistributedDataParallel."
    )


# torch 2.4 has no way to read the innermost saved_tensors_hooks from Python; torch 2.5
# added torch._C._autograd._top_saved_tensors_default_hooks (present through 2.15).
_top_hooks: Callable[[bool], Any] | None = getattr(
    torch._C._autograd, "_top_saved_tensors_default_hooks", None
)
SAVED_TENSORS_HOOKS_VISIBLE = _top_hooks is not None


def current_saved_tensors_hooks() -> tuple[Callable[..., Any], Callable[..., Any]] | None:
    """Return the innermost active ``(pack, unpack)`` saved-tensor hooks, or ``None``.

    Always ``None`` on torch 2.4, which cannot report them
    (:data:`SAVED_TENSORS_HOOKS_VISIBLE` is then false).
    """
    if _top_hooks is None:
        return None
    hooks = _top_hooks(False)
    return None if hooks is None else (hooks[0], hooks[1])


def checkpoint_supports_vmap() -> bool:
    """Whether ``torch.func.vmap`` works over torch's non-reentrant checkpoint.

    Up to torch 2.4.1 (and later releases that still save a checkpoint's inputs
    through the ``_NoopSaveInputs`` autograd Function), vmap raises "You tried to
    vmap over _NoopSaveInputs, but it does not have vmap support". pytorch#174327
    (present in 2.13 and 2.15) saves them through ``torch._C._autograd._make_saved_tensor``
    instead, which vmap passes through.
    """
    return hasattr(torch._C._autograd, "_make_saved_tensor")


#: Whether ``torch.utils.checkpoint.checkpoint`` takes ``early_stop`` (not in 2.4.1; in 2.13).
#: Read once at import: under torch.compile, dynamo cannot trace inspect.signature of
#: torch's checkpoint (a higher-order op there).
CHECKPOINT_TAKES_EARLY_STOP = (
    "early_stop" in inspect.signature(torch.utils.checkpoint.checkpoint).parameters
)


#: Whether torch's checkpoint takes ``respect_saved_tensors_hooks`` (new in 2.15; not in
#: 2.13 or 2.4.1).
CHECKPOINT_TAKES_RESPECT_HOOKS = (
    "respect_saved_tensors_hooks" in inspect.signature(torch.utils.checkpoint.checkpoint).parameters
)

#: torch's error for non-reentrant-only options given to the reentrant variant; 2.15 added
#: ``respect_saved_tensors_hooks`` to the list and to the message.
REENTRANT_OPTIONS_MESSAGE = (
    "Passing `context_fn`, `debug`, or `respect_saved_tensors_hooks` is only supported "
    "when use_reentrant=False."
    if CHECKPOINT_TAKES_RESPECT_HOOKS
    else "Passing `context_fn` or `debug` is only supported when use_reentrant=False."
)


def checkpoint_early_stop(early_stop: bool) -> tuple[dict[str, Any], AbstractContextManager[Any]]:
    """Return how to pass ``early_stop`` to ``torch.utils.checkpoint.checkpoint``.

    torch 2.4.1's ``checkpoint`` has no ``early_stop`` argument, only the global
    ``set_checkpoint_early_stop`` (on by default); 2.13 and 2.15 take the argument,
    which the global switch overrides when it is set. On a torch without the
    argument, ``early_stop=False`` becomes ``set_checkpoint_early_stop(False)`` around
    the call (read when the forward runs), and ``True`` leaves the global switch alone.

    Returns:
        Keyword arguments for torch's ``checkpoint``, and a context to call it in.
    """
    if CHECKPOINT_TAKES_EARLY_STOP:
        return {"early_stop": early_stop}, nullcontext()
    if early_stop:
        return {}, nullcontext()
    return {}, torch.utils.checkpoint.set_checkpoint_early_stop(False)


def checkpoint_debug_leaks_on_error() -> bool:
    """Whether torch's ``debug=True`` checkpoint leaves its logging mode behind on an error.

    In torch 2.4.1, when a debug-mode recomputation raises, the forward's operator
    logging (a dispatch mode and a logging handler) stays installed, so later code in
    the process logs every operator and fails ("trying to pop from empty mode stack");
    torch's own checkpoint does it too. 2.13 and 2.15 clean up. The release in between
    that fixed it is not pinned down, so every release before 2.13 counts as leaking.
    """
    return torch_release() < (2, 13)


def checkpoint_knows_device(device_type: str) -> bool:
    """Whether torch's non-reentrant checkpoint can take tensor arguments on ``device_type``.

    ``torch.utils.checkpoint`` (2.4.1 to 2.13 and 2.15 alike) infers the device type of
    its tensor arguments and looks up ``getattr(torch, device_type)`` before anything
    else, even with ``preserve_rng_state=False``; a device that registers no device
    module (XLA: there is no ``torch.xla``) raises ``AttributeError`` there.
    """
    return device_type in ("cpu", "meta") or hasattr(torch, device_type)


def graph_exec_group() -> Any:
    """Return ``torch.utils.checkpoint.GraphExecGroup``, or ``None`` where it does not exist.

    Absent from torch 2.4.1; present in 2.13 and 2.15.
    """
    return getattr(torch.utils.checkpoint, "GraphExecGroup", None)


# Bound at import, so that a later global rebinding of torch's names to accel's does not
# turn the probe below into a call of accel's own checkpoint.
_TORCH_CHECKPOINT = torch.utils.checkpoint.checkpoint
_TORCH_CHECKPOINT_SEQUENTIAL = torch.utils.checkpoint.checkpoint_sequential


def _identity(value: torch.Tensor) -> torch.Tensor:
    return value


@functools.cache
def missing_use_reentrant_warning(sequential: bool) -> tuple[type[Warning], str] | None:
    """Return the warning the installed torch gives when ``use_reentrant`` is not passed.

    torch warns and then uses the reentrant variant, with a wording that changed
    between releases (2.4.1: "In version 2.4 we will raise an exception...", 2.13:
    "Starting in PyTorch 2.9, calling checkpoint without use_reentrant will raise an
    exception...", 2.15: "In a future release..."). It is read from the installed
    torch once, by calling its ``checkpoint`` (``checkpoint_sequential`` when
    ``sequential``) on a scalar without grad, so that ours says exactly what torch
    says.

    Returns:
        The warning's category and text, or ``None`` if this torch does not warn.
    """
    value = torch.zeros(())
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        if sequential:
            _TORCH_CHECKPOINT_SEQUENTIAL([_identity], 1, value)  # type: ignore[no-untyped-call]
        else:
            _TORCH_CHECKPOINT(_identity, value)
    for warning in caught:
        if "use_reentrant" in str(warning.message):
            return warning.category, str(warning.message)
    return None


def selective_checkpoint_api() -> tuple[Any, Any] | str:
    """Return torch's selective-checkpoint API, or why this torch has none.

    ``torch.utils.checkpoint.create_selective_checkpoint_contexts`` and
    ``CheckpointPolicy`` became public in torch 2.5; torch 2.4 has only a private
    form meant for ``torch.compile``.

    Returns:
        ``(create_selective_checkpoint_contexts, CheckpointPolicy)``, or a sentence
        saying that the installed torch lacks them.
    """
    create = getattr(torch.utils.checkpoint, "create_selective_checkpoint_contexts", None)
    policy = getattr(torch.utils.checkpoint, "CheckpointPolicy", None)
    if create is None or policy is None:
        return (
            f"torch {torch.__version__} has no torch.utils.checkpoint."
            "create_selective_checkpoint_contexts (added in torch 2.5); upgrade torch to "
            "2.5 or later for operator-grain checkpointing"
        )
    return create, policy


def keep_selective_cache_outside_hooks(forward_context: Any) -> None:
    """Keep the outputs a selective checkpoint caches out of saved-tensor hooks.

    torch 2.15 lets the caching mode route what it keeps through the saved-tensor hooks
    in scope (``respect_saved_tensors_hooks``; unset, it warns that this will become
    the default). A checkpoint that is itself built on those hooks must keep the
    earlier behaviour, where the cache bypasses them; older releases always did.
    """
    if hasattr(forward_context, "respect_saved_tensors_hooks"):
        forward_context.respect_saved_tensors_hooks = False


@functools.cache
def fake_profile_unavailable() -> str | None:
    """Why a step cannot be profiled on fake tensors with this torch, or ``None``.

    torch 2.4's ``FakeTensorMode`` refuses real tensors a model keeps outside its
    parameters and buffers (transformers' T5 position buckets) and warns on data
    pointers its own kernels read, where torch 2.5 and later convert and stay silent;
    on 2.4 the planner profiles one real forward that keeps nothing instead.
    """
    version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    if version < (2, 5):
        return (
            f"torch {torch.__version__}'s fake tensors refuse some models' own tensors "
            "(fake-tensor profiling needs torch 2.5 or later)"
        )
    return None


def compiled_plans_unavailable() -> str | None:
    """Why a budget plan's compiled step cannot be checked with this torch, or ``None``.

    A plan compiles its saved-tensor calls as whole or selective checkpointed regions of
    the graph (:mod:`checkpointing.planner._compiled`); a selective region's policy is
    traced from ``create_selective_checkpoint_contexts``, public since torch 2.5 (2.4
    has a private form for the compiler only). Checked on 2.9.1 and 2.13.0.
    """
    if torch_release() < (2, 5):
        return (
            f"torch {torch.__version__} traces no public selective checkpoint under "
            "torch.compile (torch 2.5 and later do)"
        )
    return None


@functools.cache
def selective_cache_allows_mutation() -> bool:
    """Whether a selective checkpoint may keep an output that the forward later mutates.

    ``create_selective_checkpoint_contexts(..., allow_cache_entry_mutation=True)``
    (torch 2.5's public API has it) lets the cache hold storage written in place after
    it was kept, such as a dropout mask filled by ``bernoulli_`` and scaled by ``div_``.
    """
    api = selective_checkpoint_api()
    if isinstance(api, str):
        return False
    return "allow_cache_entry_mutation" in inspect.signature(api[0]).parameters


def selective_contexts(create: Callable[..., Any], policy_fn: Callable[..., Any]) -> Any:
    """Call torch's ``create`` (the selective-checkpoint API) allowing mutation if it can.

    See :func:`selective_cache_allows_mutation`.
    """
    if selective_cache_allows_mutation():
        return create(policy_fn, allow_cache_entry_mutation=True)
    return create(policy_fn)


# Devices that join torch through PrivateUse1 ------------------------------------------

#: torch 2.5 added autoloading of the ``torch.backends`` entry points at ``import torch``;
#: on 2.4 a PrivateUse1 device exists only once its vendor package has been imported.
DEVICE_BACKENDS_AUTOLOAD = torch_release() >= (2, 5)

#: PrivateUse1's device type before any ``torch.utils.rename_privateuse1_backend``.
PRIVATEUSE1_DEFAULT_NAME = "privateuseone"


def privateuse1_device_type() -> str | None:
    """Return the name a vendor gave torch's PrivateUse1 device, or ``None`` if none did.

    ``torch.device("privateuseone")`` parses to the PrivateUse1 device type, whose name
    is the renamed one once a vendor called ``rename_privateuse1_backend`` (2.4 to 2.15
    alike). Reads a name only: initialises nothing.
    """
    name = torch.device(PRIVATEUSE1_DEFAULT_NAME).type
    return None if name == PRIVATEUSE1_DEFAULT_NAME else name


def accelerator_function(name: str) -> Callable[..., Any] | None:
    """Return ``torch.accelerator.<name>``, or ``None`` where this release lacks it.

    ``torch.accelerator`` arrived in 2.6 (device and stream members), memory members in
    2.9 and ``get_memory_info`` in 2.10 (``../shared/research``'s table, per release).
    """
    module = getattr(torch, "accelerator", None)
    function = getattr(module, name, None)
    return function if callable(function) else None


def default_communication_backend(device_type: str) -> str | None:
    """Return the ``torch.distributed`` backend torch maps ``device_type`` to, if any.

    ``Backend.default_device_backend_map`` exists in 2.4 to 2.15 (2.6 added ``xpu``, 2.8
    ``mps``); a vendor's ``register_backend(..., devices=[...])`` adds its device there.
    ``None`` where torch has no distributed support or no entry for the device.
    """
    import torch.distributed as dist

    if not dist.is_available():
        return None
    mapping: dict[str, str] = getattr(dist.Backend, "default_device_backend_map", {})
    found = mapping.get(device_type)
    return None if found is None else str(found)


# torch 2.4's Tensor.pin_memory()/is_pinned() default to CUDA and need ``device=`` for
# any other accelerator; from 2.5 they use the current accelerator, and passing
# ``device`` gives a DeprecationWarning (pytorch#126376).
_PIN_NEEDS_DEVICE = torch_release() < (2, 5)


def pin_memory(tensor: torch.Tensor, device_type: str) -> torch.Tensor:
    """Return ``tensor`` page-locked for ``device_type`` (itself if already pinned)."""
    if _PIN_NEEDS_DEVICE:
        if tensor.is_pinned(device_type):
            return tensor
        return tensor.pin_memory(device_type)
    return tensor if tensor.is_pinned() else tensor.pin_memory()


def sole_owner(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is the only tensor (or view) holding its storage's memory.

    torch has no public way to ask; ``torch._C._storage_Use_Count`` (present in every
    release accel supports, 2.4 to 2.15) counts the storage's owners, here ``tensor`` and
    the storage object this call makes. Where a release lacks it, the answer is ``False``:
    a caller then never reuses memory someone else may still read.
    """
    count = getattr(torch._C, "_storage_Use_Count", None)
    if count is None:
        return False
    storage = tensor.untyped_storage()
    return int(count(storage._cdata)) <= 2


#: Whether CUDA's memory-efficient attention takes grouped-query attention
#: (``enable_gqa=True`` with fewer key/value heads) and a single key/value head without
#: it. 2.13's documentation of ``scaled_dot_product_attention`` says GQA works with flash
#: attention and the math kernel only; 2.14.1's adds memory-efficient attention on NVIDIA
#: GPUs (pytorch#191085). Before that, an fp32 GQA call runs the math path.
EFFICIENT_ATTENTION_TAKES_GQA = torch_release() >= (2, 14)

# torch.nn.attention.SDPBackend's values (0 math, 1 flash, 2 efficient, 3 cuDNN, 4
# overrideable), the same in 2.4 to 2.15.
_SDP_NAMES = ("math", "flash_attention", "efficient_attention", "cudnn_attention", "overrideable")


def sdp_priority_order() -> tuple[str, ...]:
    """The order in which torch tries the attention kernels, by name (lower-cased).

    Read from ``torch._C._get_sdp_priority_order`` (present in 2.9.1 and 2.13); a release
    without it used the fixed order flash, memory-efficient, math, cuDNN. On a GPU
    torch may move cuDNN first on its first attention call (Hopper and Blackwell with a
    recent cuDNN), which a host without the GPU cannot know.
    """
    read = getattr(torch._C, "_get_sdp_priority_order", None)
    order = [int(value) for value in read()] if callable(read) else [1, 2, 0, 3]
    return tuple(_SDP_NAMES[value] for value in order if 0 <= value < len(_SDP_NAMES))


class _HandsOnNothing(torch.autograd.Function):
    """An identity whose backward hands its input no gradient (for the probe below)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> None:
        return None


@functools.cache
def post_accumulate_hooks_run_without_gradient() -> bool:
    """Whether a leaf's post-accumulate-grad hooks run when backward hands it no gradient.

    Older releases' ``AccumulateGrad`` returns before its hooks when the gradient is
    undefined; 2.9.1 and 2.13.0 run them whenever the node runs. The release notes do not
    say which release changed it, so it is probed once, on the host, with a one-element
    leaf.
    """
    fired: list[bool] = []
    leaf = torch.zeros(1, requires_grad=True)
    hook = lambda tensor: fired.append(True)  # noqa: E731
    leaf.register_post_accumulate_grad_hook(hook)  # type: ignore[no-untyped-call]
    with torch.enable_grad():
        output = _HandsOnNothing.apply(leaf)  # type: ignore[no-untyped-call]
        output.sum().backward()
    return bool(fired)


# aten._grouped_mm (a mixture of experts' expert layers in transformers 5): the CPU
# kernel multiplies float32, but the fake kernel of torch 2.9.1 and 2.13.0 refuses
# anything but bfloat16 ("Expected inputs of BF16 type"), so a fake step of a float32
# model fails where its real step runs. torch 2.15.0's fake kernel takes float32.
def grouped_mm_fake_output(
    first: torch.Tensor,
    second: torch.Tensor,
    offs: torch.Tensor | None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """An empty tensor shaped and laid out as ``aten._grouped_mm``'s output.

    For fake inputs, where this release's fake kernel refuses their dtype. The groups
    split the rows of a 2-D first operand (against a 3-D second), the columns of a 2-D
    second one (against a 3-D first), or, with both 2-D, the contracted dimension, and
    stack their products in a new first dimension; two 3-D operands are a batch. The
    output is contiguous, as the CPU kernel writes it.
    """
    columns = second.shape[-1]
    if first.dim() == 2 and second.dim() == 2:
        groups = 1 if offs is None else offs.shape[0]
        shape: tuple[int, ...] = (groups, first.shape[0], columns)
    elif first.dim() == 3 and second.dim() == 3:
        shape = (first.shape[0], first.shape[1], columns)
    else:
        shape = (first.shape[-2], columns)
    return first.new_empty(shape, dtype=out_dtype or first.dtype)
