"""Today's peers timed beside ours under the same cap, out-of-memory a result, not a crash.

:func:`compare_fsdp2`, :func:`compare_fairscale` and :func:`compare_deepspeed` (its child
process: :func:`deepspeed_peer`) time each peer on the same blocks with the same host
optimizer; how each is built is in ``_offload_peers.py``. A peer that runs out of memory
under the cap is timed again under a raised cap (:func:`time_under_caps`).

fairscale 0.4.13 keeps every shard's input gradient during backward, so under the cap
ours runs in (3 GiB for the default model) it needs about 3.25 GiB and runs out of
memory. bench_offload.py times ours first; then fairscale under the same cap, and, if
that runs out of memory, once more under a raised cap (more memory than ours had, so the
comparison only flatters fairscale). Each attempt's outcome is recorded.

torch's pinned host allocator rounds every request up to a power of two and keeps freed
blocks cached, so between the wrappers the host cache is emptied as well as the device's.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from _offload_measure import (
    allocator_retries,
    cap_memory,
    host_optimizer,
    limit_device_memory,
    make_model,
    peer_caps,
    timed_training,
    train,
)
from torch import nn

from accel import Accelerator

# torch.cuda.OutOfMemoryError exists on every supported release (newer ones also name the
# same class torch.OutOfMemoryError).
T = TypeVar("T")

OUT_OF_MEMORY: tuple[type[BaseException], ...] = (torch.cuda.OutOfMemoryError,)
#: The script whose ``--peer deepspeed`` is DeepSpeed's child process.
SCRIPT = Path(__file__).with_name("bench_offload.py")


def empty_host_cache() -> str:
    """Return cached pinned host blocks to the system; name the call used, or ``"none"``."""
    # Newest first: torch.accelerator's public call, then the private ones before it.
    for owner, name in (("accelerator", "empty_host_cache"), ("_C", "_accelerator_emptyHostCache"),
                        ("_C", "_host_emptyCache")):  # fmt: skip
        release = getattr(getattr(torch, owner, None), name, None)
        if not callable(release):
            continue
        try:
            release()
        except RuntimeError:  # no accelerator (a CPU build): nothing is cached
            return "none: no accelerator"
        return f"torch.{owner}.{name}"
    return "none"


def release_memory(backend: Accelerator) -> str:
    """Collect garbage, then empty the device cache and the pinned host cache."""
    gc.collect()
    backend.synchronize()
    backend.empty_cache()
    return empty_host_cache()


def time_under_caps(
    caps_gib: list[float],
    build: Callable[[], Any],
    time_steps: Callable[[Any], T],
    set_cap: Callable[[float], None],
    release: Callable[[], object],
) -> tuple[T | None, dict[str, Any]]:
    """Build and time a model under each cap in turn until one run does not run out of memory.

    Returns:
        The step times (``None`` if every cap ran out of memory) and a record of every
        attempt: ``{"result": ..., "attempts": [{"cap_gib", "outcome", "error"?}]}``.
    """
    attempts: list[dict[str, Any]] = []
    for cap in caps_gib:
        set_cap(cap)
        error = ""
        try:
            model = build()
            times: T | None = time_steps(model)
        except OUT_OF_MEMORY as exc:
            error = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else repr(exc)
            times = None
        model = None
        release()
        if times is not None:
            attempts.append({"cap_gib": cap, "outcome": "timed"})
            first = attempts[0]["cap_gib"]
            result = "timed" if cap == first else (
                f"out of memory under the {first:g} GiB cap; timed under {cap:g} GiB"
            )  # fmt: skip
            return times, {"result": result, "attempts": attempts}
        attempts.append({"cap_gib": cap, "outcome": "out of memory", "error": error})
    caps = ", ".join(f"{cap:g}" for cap in caps_gib)
    return None, {
        "result": f"out of memory under every cap tried ({caps} GiB)",
        "attempts": attempts,
    }


def speedup_target(
    theirs: float | None, ours: float, record: dict[str, Any], wanted: float
) -> dict[str, Any]:
    """The throughput-against-fairscale target; ``met`` is ``None`` when nothing compares."""
    note = "" if record["result"] == "timed" else f"fairscale: {record['result']}"
    if theirs is None:
        return {"value": None, "target": wanted, "met": None, "note": note}
    value = theirs / ours
    return {"value": value, "target": wanted, "met": value >= wanted, "note": note}


def compare_fsdp2(
    backend: Accelerator, reference: nn.Sequential, x: torch.Tensor, args: argparse.Namespace
) -> tuple[dict[str, list[float]] | None, dict[str, Any]]:
    """Time FSDP2 with CPU offload under the cap, then a raised cap if it runs out.

    A refusal or running out of memory under every cap is its result.
    """
    from _offload_peers import PIN_REFUSAL, build_fsdp2, first_line, single_process_group

    device = backend.device()
    record: dict[str, Any] = {"units": "one per block, each block checkpointed; the whole batch"}

    def build() -> nn.Module:
        try:
            model = build_fsdp2(reference, device)
            record["pin_memory"] = True
        except RuntimeError as exc:
            if PIN_REFUSAL not in str(exc) or backend.device_type == "cuda":
                raise
            # The host without an accelerator: torch cannot pin. Same code, unpinned.
            record["pinned_refusal"] = first_line(exc)
            model = build_fsdp2(reference, device, pin_memory=False)
            record["pin_memory"] = False
        return model

    def time_steps(model: nn.Module) -> dict[str, list[float]]:
        backend.reset_peak_memory_stats()
        before = allocator_retries(backend)
        times = train(backend, model, x.to(device), args.steps)
        after = allocator_retries(backend)
        record["peak_device_bytes"] = backend.max_memory_allocated()
        if before is not None and after is not None:
            record["allocator_retries"] = after - before
        return times

    try:
        with single_process_group(device.type):
            times, outcome = time_under_caps(
                peer_caps(args),
                build,
                time_steps,
                lambda gib: cap_memory(backend, args, gib),
                lambda: release_memory(backend),
            )
    except Exception as exc:  # a peer's failure is a result, never the run's end
        record["result"] = f"failed: {first_line(exc)}"
        release_memory(backend)
        return None, record
    finally:
        cap_memory(backend, args, args.budget_gib)  # the budget again, for the next peer
    record.update(outcome)
    if times is not None and not record["pin_memory"]:
        record["result"] = record["result"].replace("timed", "timed with unpinned shards")
    return times, record


def compare_deepspeed(
    backend: Accelerator, args: argparse.Namespace, left_s: float = float("inf")
) -> dict[str, Any]:
    """Time DeepSpeed ZeRO-3 with CPU offload in a child process, where it can run at all."""
    from _offload_peers import deepspeed_status, run_deepspeed_child

    why_not = deepspeed_status(backend.device_type)
    if why_not is not None:
        return {"result": why_not}
    options = [
        "--backend", backend.name, "--steps", str(args.steps),
        "--budget-gib", str(args.budget_gib), "--blocks", str(args.blocks),
        "--width", str(args.width), "--tokens", str(args.tokens),
    ]  # fmt: skip
    timeout_s = min(args.deepspeed_timeout_s, left_s)
    record = run_deepspeed_child(SCRIPT, options, timeout_s)
    record.setdefault("timeout_s", timeout_s)
    return record


def deepspeed_peer(backend: Accelerator, args: argparse.Namespace) -> None:
    """The child process of ``compare_deepspeed``: print one JSON line with the times."""
    from _offload_peers import deepspeed_engine

    device = backend.device()
    if backend.device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    x = torch.randn(args.tokens, args.width, generator=torch.Generator().manual_seed(1))
    limit_device_memory(backend, int(args.budget_gib * 2**30))
    record: dict[str, Any] = {}
    before = allocator_retries(backend)
    try:
        engine = deepspeed_engine(
            lambda: make_model(args.blocks, args.width, 4 * args.width), host_optimizer
        )
        inputs = x.to(device)

        def forward_backward() -> None:
            engine.backward(engine(inputs).square().mean())

        times = timed_training(backend, forward_backward, engine.step, args.steps)
        record.update(times)
        record["result"] = "timed"
    except OUT_OF_MEMORY as exc:
        record["result"] = f"out of memory under the {args.budget_gib:g} GiB cap: {exc}"[:300]
    after = allocator_retries(backend)
    record["peak_device_bytes"] = backend.max_memory_allocated()
    if before is not None and after is not None:
        record["allocator_retries"] = after - before
    print(json.dumps(record))


def compare_fairscale(
    backend: Accelerator,
    reference: nn.Module,
    x: torch.Tensor,
    args: argparse.Namespace,
    slices: int,
    micro: int,
) -> tuple[dict[str, list[float]] | None, dict[str, Any]]:
    """Time fairscale's OffloadModel under the cap, then a raised cap if it runs out."""
    try:
        from fairscale.experimental.nn.offload import OffloadModel as FairscaleOffload
    except ImportError as exc:
        return None, {"result": "not installed", "error": str(exc)}
    device = backend.device()

    def build() -> nn.Module:
        return FairscaleOffload(
            copy.deepcopy(reference),
            device=device,
            offload_device=torch.device("cpu"),
            num_slices=slices,
            checkpoint_activation=True,
            num_microbatches=micro,
        )

    def time_steps(theirs: nn.Module) -> dict[str, list[float]]:
        return train(backend, theirs, x.to(device), args.steps)

    try:
        return time_under_caps(
            peer_caps(args),
            build,
            time_steps,
            lambda gib: cap_memory(backend, args, gib),
            lambda: release_memory(backend),
        )
    except TypeError as exc:
        # fairscale 0.4.13's OffloadModel refuses every device but CUDA with a TypeError.
        if "CUDA must be available" not in str(exc):
            raise
        return None, {"result": f"not run on {device}: {exc}"}
