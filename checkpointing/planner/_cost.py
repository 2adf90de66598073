"""The device rates the cost model prices a profile at: what a device computes and moves.

The planner never times the model it plans. Its profile (:mod:`._profile`) records what
each operator call computes and moves (:class:`._work.OpWork`); the cost pass
(:func:`._pricing.cost`) prices those features at a :class:`DeviceRates`: one flop
rate per class (matmul, attention, convolution; an FFT's flops at the matmul rate), one
byte rate for random draws, a default byte rate for everything else, a byte rate per
operator where one is known (a layer norm or a GELU reads its bytes several times
over), and a fixed cost per call. The rates are a built-in table (:mod:`._tables`:
the host processor's, or an accelerator's), rates calibrated on the device
(:mod:`._calibration`) and cached for the host, which
:func:`._default_rates.default_rates` prefers to the table, or the user's. They are
inputs to the plan and recorded in it, so that the same model, shapes, dtypes, budget
and rates give the same plan in every process, under any load.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

__all__ = ["DeviceRates", "tensor_bytes"]


#: A copy's bytes per second between pinned host memory and a device, each way, where
#: nothing was measured: a PCIe 4.0 x16 link (an H100 or H200 measured 55 GB/s on 5.0).
COPY_BYTES = 25e9

#: The saved-tensor grain's cost per replayed call, where nothing was measured: what the
#: host measured (``benchmarks/bench_rates.py``, 2026-11-28), an eager call's Python.
REPLAY_SECONDS = 1e-4
#: What a checkpointed module call costs beyond recomputing its forward, for rates that
#: do not say (written before ``region_seconds`` was added, or built without it): none,
#: so that they price a plan as they did when they were written.
REGION_SECONDS = 0.0
#: What one module call at the saved-tensor grain costs beyond its hooks and replays,
#: for rates that do not say (written before ``saved_call_seconds`` was added): none, as
#: for :data:`REGION_SECONDS`.
SAVED_CALL_SECONDS = 0.0
#: What a checkpointed module call costs per tensor its forward saves, for rates that do
#: not say (written before ``region_tensor_seconds`` was added): none, as for
#: :data:`REGION_SECONDS`.
REGION_TENSOR_SECONDS = 0.0

#: What a fused attention kernel costs per score beyond its products, for rates that do
#: not say (written before ``attention_score_seconds`` was added): none, as for
#: :data:`REGION_SECONDS`.
ATTENTION_SCORE_SECONDS = 0.0

#: Packed mask bytes per second where nothing was measured: that host's.
PACK_BYTES = 9.5e8


@dataclass(frozen=True)
class DeviceRates:
    """What one device computes and moves per second: the cost model's inputs.

    Attributes:
        device_type: The device type the rates describe (``"cpu"`` or an accelerator's).
        source: Where they come from: ``"built-in"``, ``"calibrated"`` (with when and
            where) or ``"given"``.
        matmul_flops: Floating-point operations per second of matrix products.
        attention_flops: Of fused attention kernels' products.
        attention_score_seconds: What a fused attention kernel adds per score (one
            query-key pair of one head; a backward's count twice) beyond its products:
            the softmax's exponentials and sums, which do not shrink with the head
            size. Rates written before this field was added read as
            :data:`ATTENTION_SCORE_SECONDS` (0: the attention rate was timed with the
            softmax inside it).
        convolution_flops: Of convolutions (forward and backward).
        memory_bytes: Bytes read and written per second by an operator without a rate
            of its own (pointwise operators, copies, reductions).
        random_bytes: Bytes written per second by random draws (dropout's mask).
        call_seconds: Fixed seconds per operator call: dispatch and the Python around it.
        policy_call_seconds: What a selective checkpoint's policy adds per operator
            call of its region (it runs in Python in the forward and again in the
            recomputation).
        policy_kept_seconds: What it adds per kept call (caching the output).
        hook_seconds: What the saved-tensor grain's hooks add per tensor autograd saves
            in a planned module (they check it against the plan in the forward and
            hand it back in backward), timed through the grain's own wrapper.
        replay_seconds: What the grain adds per operator call a recipe runs again in
            backward, beyond the call's own cost (its arguments rebuilt from the plan,
            its outputs looked up). Rates written before this field was added read as
            :data:`REPLAY_SECONDS`.
        pack_bytes: A dropout mask's float bytes per second that the grain packs into
            booleans and rebuilds in backward. Rates written before this field was
            added read as :data:`PACK_BYTES`.
        region_seconds: What one checkpointed module call (whole, or with a selective
            policy) costs beyond recomputing its operators: the checkpoint's own
            machinery in the forward and in backward (frames and hooks, the unpack that
            starts the recomputation, the generator states kept and restored). Rates
            written before this field was added read as :data:`REGION_SECONDS` (0).
        region_tensor_seconds: What a checkpointed module call costs per tensor its
            forward saves for backward, beyond ``region_seconds`` and its operators:
            the checkpoint's hook for each such tensor in the forward, again in the
            recomputation, and its unpack in backward. A call whose forward saves a
            hundred tensors pays it a hundred times. Rates written before this field
            was added read as :data:`REGION_TENSOR_SECONDS` (0).
        saved_call_seconds: What one module call at the saved-tensor grain costs
            beyond its hooks per saved tensor and its replays per call: the wrapper's
            checks of the call's inputs, the hooks and generator states set up in the
            forward, and the first recomputation that backward starts. Rates written
            before this field was added read as :data:`SAVED_CALL_SECONDS` (0).
        operator_bytes: Bytes per second for named operators (``"aten.gelu.default"``),
            where one rate for all of them would be far off.
        to_host_bytes: Bytes per second a copy from the device to page-locked host
            memory moves (the offload grain's forward copies). Rates written before
            this field was added read as the default, a PCIe 4.0 x16 link's 25 GB/s.
        to_device_bytes: Bytes per second of the copy back (the grain's reloads).
    """

    device_type: str
    source: str
    matmul_flops: float
    attention_flops: float
    convolution_flops: float
    memory_bytes: float
    random_bytes: float
    call_seconds: float
    policy_call_seconds: float
    policy_kept_seconds: float
    hook_seconds: float
    operator_bytes: Mapping[str, float] = field(default_factory=dict)
    to_host_bytes: float = COPY_BYTES
    to_device_bytes: float = COPY_BYTES
    replay_seconds: float = REPLAY_SECONDS
    pack_bytes: float = PACK_BYTES
    region_seconds: float = REGION_SECONDS
    saved_call_seconds: float = SAVED_CALL_SECONDS
    region_tensor_seconds: float = REGION_TENSOR_SECONDS
    attention_score_seconds: float = ATTENTION_SCORE_SECONDS

    def __post_init__(self) -> None:
        for name, value in self._numbers():
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(
                    f"checkpointing: DeviceRates.{name} is {value!r}; every rate must be a "
                    "finite number of at least 0. Pass rates calibrated on the device "
                    "(checkpointing.calibrate_rates) or the built-in ones."
                )
        positive = ("matmul_flops", "attention_flops", "convolution_flops", "memory_bytes")
        for name in (*positive, "pack_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(
                    f"checkpointing: DeviceRates.{name} is 0; a rate per second must be "
                    "positive. Pass rates calibrated on the device or the built-in ones."
                )
        object.__setattr__(self, "operator_bytes", dict(sorted(self.operator_bytes.items())))

    def _numbers(self) -> list[tuple[str, Any]]:
        numbers = [(k, v) for k, v in asdict(self).items() if k not in _TEXT_FIELDS]
        numbers.remove(("operator_bytes", self.operator_bytes))
        numbers += [(f"operator_bytes[{k!r}]", v) for k, v in self.operator_bytes.items()]
        return numbers

    def to_dict(self) -> dict[str, Any]:
        """The rates as plain JSON values (what a saved plan records)."""
        values = asdict(self)
        values["operator_bytes"] = dict(self.operator_bytes)
        return values

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> DeviceRates:
        """Rates from :meth:`to_dict`'s form.

        Raises:
            ValueError: If a field is missing or unknown.
        """
        names = set(cls.__dataclass_fields__)
        missing, unknown = names - set(values) - _LATER_FIELDS, set(values) - names
        if missing or unknown:
            raise ValueError(
                "checkpointing: these device rates do not match DeviceRates "
                f"(missing: {sorted(missing) or 'none'}; unknown: {sorted(unknown) or 'none'}). "
                "Pass the dictionary DeviceRates.to_dict() wrote."
            )
        return cls(**{**values, "operator_bytes": dict(values["operator_bytes"])})

    def scaled(self, factor: float, source: str) -> DeviceRates:
        """These rates with every per-second rate times ``factor`` (a faster device).

        The attention kernels' seconds per score are computation too, and divide by it;
        the fixed costs of calls and of the grains' Python stay.
        """
        return replace(
            self,
            source=source,
            matmul_flops=self.matmul_flops * factor,
            attention_flops=self.attention_flops * factor,
            attention_score_seconds=self.attention_score_seconds / factor,
            convolution_flops=self.convolution_flops * factor,
            memory_bytes=self.memory_bytes * factor,
            random_bytes=self.random_bytes * factor,
            pack_bytes=self.pack_bytes * factor,
            operator_bytes={k: v * factor for k, v in self.operator_bytes.items()},
        )


_TEXT_FIELDS = frozenset({"device_type", "source"})
#: Fields added after the first rate files were written: those files read as defaults.
_LATER_FIELDS = frozenset(
    {
        "to_host_bytes",
        "to_device_bytes",
        "replay_seconds",
        "pack_bytes",
        "region_seconds",
        "saved_call_seconds",
        "region_tensor_seconds",
        "attention_score_seconds",
    }
)


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Bytes a tensor's elements span (its view, not its whole storage)."""
    return tensor.numel() * tensor.element_size()
