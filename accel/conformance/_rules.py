"""The rules the conformance suite checks, by id."""

from __future__ import annotations

__all__ = ["RULES", "rule"]

RULES: dict[str, str] = {
    "members": "every Accelerator member exists",
    "identity": "device(), device_type and name agree and round-trip through torch.device",
    "device-index": "invalid device indices raise accel.DeviceIndexError",
    "device-count": "every index below device_count() is usable by device(i), and no other",
    "no-init": "is_available(), device_count() and device() do not initialise the device",
    "capabilities": "capability flags are booleans",
    "rng-roundtrip": "set_rng_state(get_rng_state()) restores the device generator",
    "rng-seed": "manual_seed(s) makes the device generator deterministic",
    "fork-rng": "fork_rng() restores the CPU and device generators, also on exception",
    "rng-copy": "get_rng_state() returns a copy that the backend never writes to",
    "dropout-seed": "the same seed gives the same dropout mask on the device",
    "autocast-capture": "autocast_kwargs() reports the active autocast state",
    "autocast-replay": "replaying captured autocast kwargs gives the same dtypes",
    "streams": "Stream(), Event() and current_stream() give working objects, never None",
    "copy-engines": "copy_engines (own or accel's default) is an int >= 0, 0 without streams",
    "stream-order": "work ordered with events and wait_stream sees the producer's result",
    "pin-memory": "pin_memory keeps values and pins exactly when supported",
    "empty-pinned": "empty_pinned(shape, dtype) allocates host memory, pinned when supported",
    "memory-stats": "memory statistics are non-negative ints that track allocations",
    "mark-step": "mark_step() is callable any time, including inside backward",
    "recompute-barrier": "the recompute barrier (own or accel's default) keeps values and grads",
    "distributed": (
        "communication_backend is a torch.distributed backend after preparation, or "
        "'undefined' where prepare_distributed() raises DistributedSetupError"
    ),
    "dtypes": "is_bf16_supported()/is_fp16_supported() are booleans that hold",
    "checkpoint-dropout": "dropout inside a checkpoint gives the plain run's gradients",
    "checkpoint-compile": "under torch.compile the checkpoint gives torch's checkpoint's results",
    "checkpoint-vmap": "torch.func.vmap over the non-reentrant checkpoint gives the plain values",
    "rng-devices": "get_rng_state/set_rng_state/fork_rng address each device index",
    "compile-backend": "compile_backend names a torch.compile backend that compiles on the device",
    "attention-kernel": (
        "attention_kernel (own or accel's default) answers None or one of "
        "accel.ATTENTION_KERNELS for meta tensors"
    ),
}
"""Every conformance rule: its id (what a failure message names) and what it checks."""


def rule(rule_id: str, message: str) -> str:
    """Return a failure message naming the rule: ``conformance rule <id>: <message>``."""
    if rule_id not in RULES:
        raise KeyError(f"unknown conformance rule {rule_id!r}; known: {', '.join(RULES)}")
    return f"conformance rule {rule_id} ({RULES[rule_id]}): {message}"
