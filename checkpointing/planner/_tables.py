"""The built-in rate tables: one per host processor they were measured on, one for accelerators.

A host CPU's rates differ by processor more than by anything a plan can see: on the
two hosts measured here, the Python around an eager call (a selective policy, a
saved-tensor hook, a replayed call, a checkpointed call's machinery) cost two and a
half to three and a half times as much on one as on the other, and most pointwise
operators moved a sixth to a half of the bytes per second, while matrix products ran at
about the same rate. A plan priced
with the other host's table recomputes what that host finds dear. So the CPU has one
table per processor it was measured on (:data:`CPU_TABLES`), and :func:`builtin_rates`
takes the one whose processor this host's is (:class:`HostProcessor`, read from
``/proc/cpuinfo``; no clock is read and nothing is timed, so every process on a host
takes the same table). A host whose processor no table was measured on takes the first
table, and :func:`cpu_table_note` says so, for the plan's note:
``checkpointing.calibrate_rates(save=True)`` measures that host's own rates once.

Every other device type takes one accelerator table (a current data-centre GPU's),
until rates are calibrated on it.
"""

from __future__ import annotations

import functools
import platform
from collections.abc import Callable
from dataclasses import dataclass, replace

from ._cost import REGION_SECONDS, SAVED_CALL_SECONDS, DeviceRates

__all__ = [
    "CPU_TABLES",
    "CpuTable",
    "HostProcessor",
    "builtin_rates",
    "cpu_table",
    "cpu_table_note",
    "host_processor",
    "processor_of",
]


@dataclass(frozen=True)
class HostProcessor:
    """What this host says its processor is: what a CPU table is chosen by.

    Attributes:
        vendor: ``/proc/cpuinfo``'s ``vendor_id`` (``"GenuineIntel"``,
            ``"AuthenticAMD"``), else empty.
        family: Its ``cpu family`` (AMD's Zen 5 is 26), else ``None``.
        model: Its ``model`` number, else ``None``.
        name: Its ``model name``; for this host where that is unknown,
            :func:`platform.processor` or the machine type.
    """

    vendor: str = ""
    family: int | None = None
    model: int | None = None
    name: str = ""


@functools.cache
def host_processor() -> HostProcessor:
    """This host's processor, from ``/proc/cpuinfo`` (Linux; read once per process).

    Elsewhere, or where the file does not read, only the name is known: the platform's.
    """
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            text = info.read()
    except OSError:
        text = ""  # not Linux
    processor = processor_of(text)
    if processor.name:
        return processor
    return replace(processor, name=platform.processor() or platform.machine())


def processor_of(cpuinfo: str) -> HostProcessor:
    """The processor ``/proc/cpuinfo``'s text describes: its first processor's fields.

    A field the text lacks (an arm64 host has no ``vendor_id``) is left unknown.
    """
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block is enough: a host has one kind
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return HostProcessor(
        vendor=fields.get("vendor_id", ""),
        family=_number(fields.get("cpu family")),
        model=_number(fields.get("model")),
        name=fields.get("model name", ""),
    )


def _number(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


@dataclass(frozen=True)
class CpuTable:
    """One built-in CPU table and the processors it was measured on.

    Attributes:
        processor: The processors it is for, in words (for the plan's note).
        measured_on: The host it was measured on and when, in words.
        matches: Whether a host's processor is one of those.
        rates: The rates.
    """

    processor: str
    measured_on: str
    matches: Callable[[HostProcessor], bool]
    rates: DeviceRates


# Measured on this workplace's Intel Xeon machine (2 vCPUs under KVM, 2 MiB of L2 a
# core; one intra-op thread; torch 2.13.0), idle, by benchmarks/bench_rates.py on
# 2026-12-06: checkpointing.calibrate_rates three times without a model and once per zoo
# family (benchmarks/_zoo.py, all 20, Mixtral's and Mamba's included) with the family's
# model; each general rate is the median over the 23 runs, each operator's the median
# over the families that call it, each operator timed as itself
# (benchmarks/results/rates-cpu-xeon-20261206.json; a second run right after it,
# rates-cpu-xeon-20261206-again.json, is within 0.14 of it on every general rate). The
# table it replaces (2026-11-28 and 2026-11-29) was measured before an operator was
# timed as itself: gelu's backward had been timed as another operator and priced at
# six times its own rate. See docs/memory-budget-planning.md, "Device rates".
_XEON = DeviceRates(
    device_type="cpu",
    source="built-in",
    matmul_flops=1.49e11,
    # Fused attention split into its products' rate and a cost per score
    # (_calibrate.attention_fit: 4 x 8 heads of 256 positions, 64 and 8 wide): the
    # median of 7 runs on the same host, 148 to 158 GFLOP/s and 0.62 to 0.69 ns a
    # score, one thread, 2026-12-06. The table's runs timed 64-wide heads alone, with
    # the softmax inside the rate: 98.6 GFLOP/s.
    attention_flops=1.56e11,
    attention_score_seconds=6.6e-10,
    convolution_flops=1.41e11,
    memory_bytes=2.82e10,
    random_bytes=6.84e08,
    call_seconds=1.1e-06,
    policy_call_seconds=5.25e-05,
    policy_kept_seconds=5.11e-05,
    hook_seconds=5.43e-06,
    replay_seconds=0.0001,
    # Dropout masks packed and rebuilt through the grain's wrapper, as a call after its
    # layout's checked first one packs them, unchecked (_saved_machinery._pack_bytes:
    # four 2 MiB masks against the same hooks planning nothing), rebuilt from the flags
    # read as bytes: the median of 14 runs on the same host, 2.09 to 2.72 GB/s, one
    # thread, 2026-12-06 (evening). Rebuilt from booleans, the same session measured
    # 1.88 to 2.17 (an afternoon's 7 runs gave 2.04 to 2.73); one mask packed in a loop
    # and checked every element, as the table's runs did, 1.51.
    pack_bytes=2.39e09,
    # A checkpointed call's own machinery, split into a cost per call and one per tensor
    # it saves (_overheads.region_overhead, chains of calls saving 2 and 18 tensors):
    # the median of 7 runs on the same host after the table's runs, 208 to 271 us a call
    # and 11.4 to 13.8 us a tensor, one thread, 2026-12-06. The table's runs, which
    # timed the 2-tensor chain alone, gave 322 us a call: 246 us and two tensors' 25.
    region_seconds=2.46e-4,
    region_tensor_seconds=1.24e-5,
    saved_call_seconds=8.2e-05,
    operator_bytes={
        "aten._log_softmax.default": 7.25e09,
        "aten._log_softmax_backward_data.default": 1.32e10,
        "aten._safe_softmax.default": 2.6e09,
        "aten._softmax.default": 8.84e09,
        "aten._softmax_backward_data.default": 1.54e10,
        "aten._to_copy.default": 1.31e10,
        "aten.abs.default": 7.98e10,
        "aten.add.Tensor": 1.52e10,
        "aten.add_.Tensor": 1.65e10,
        "aten.bitwise_and.Tensor": 5.93e09,
        "aten.cat.default": 1.05e10,
        "aten.clone.default": 1.12e10,
        "aten.copy_.default": 8.88e09,
        "aten.div.Scalar": 1.03e10,
        "aten.div.Tensor": 1.41e10,
        "aten.div_.Scalar": 1.08e10,
        "aten.embedding.default": 1.44e10,
        "aten.embedding_dense_backward.default": 1e10,
        "aten.exp.default": 1.5e10,
        "aten.full_like.default": 4e10,
        "aten.gather.default": 1.29e10,
        "aten.gelu.default": 7.74e09,
        "aten.gelu_backward.default": 6.08e09,
        "aten.gt.Scalar": 1.16e10,
        "aten.index.Tensor": 8.24e09,
        "aten.index_put.default": 7.87e09,
        "aten.log.default": 7.06e08,
        "aten.lt.Scalar": 1.55e10,
        "aten.mean.dim": 1.29e10,
        "aten.minimum.default": 2.25e10,
        "aten.mul.Scalar": 1.19e10,
        "aten.mul.Tensor": 1.64e10,
        "aten.native_batch_norm.default": 3.91e09,
        "aten.native_batch_norm_backward.default": 9.97e09,
        "aten.native_group_norm.default": 1.45e10,
        "aten.native_group_norm_backward.default": 1.14e10,
        "aten.native_layer_norm.default": 1.03e10,
        "aten.native_layer_norm_backward.default": 1.18e10,
        "aten.neg.default": 2.09e10,
        "aten.new_zeros.default": 1.61e10,
        "aten.nll_loss_backward.default": 1.9e10,
        "aten.nll_loss_forward.default": 4.87e10,
        "aten.ones_like.default": 2.08e10,
        "aten.pow.Tensor_Scalar": 1.48e10,
        "aten.relu.default": 1.92e10,
        "aten.roll.default": 6.95e09,
        "aten.scatter_add.default": 1.02e10,
        "aten.select_backward.default": 9.25e09,
        "aten.sigmoid.default": 1.57e10,
        "aten.sigmoid_backward.default": 3.29e10,
        "aten.silu.default": 1.47e10,
        "aten.silu_backward.default": 1.57e10,
        "aten.slice_backward.default": 9.15e09,
        "aten.softplus.default": 4.71e09,
        "aten.softplus_backward.default": 1.48e10,
        "aten.stack.default": 1.01e10,
        "aten.sub.Tensor": 1.25e10,
        "aten.sum.default": 5.69e10,
        "aten.sum.dim_IntList": 1.46e10,
        "aten.tanh.default": 1.75e10,
        "aten.tanh_backward.default": 3.8e10,
        "aten.threshold_backward.default": 2.81e10,
        "aten.upsample_nearest2d.default": 1.44e10,
        "aten.upsample_nearest2d_backward.default": 1.3e10,
        "aten.where.self": 1.16e09,
        "aten.zeros.default": 1.12e10,
    },
)

# Measured on this workplace's second CPU machine kind (AMD EPYC, family 26: Zen 5;
# 2 vCPUs under KVM, 1 MiB of L2 a core; one intra-op thread; torch 2.13.0), idle, by
# benchmarks/bench_rates.py on 2026-12-05, as the Xeon table's byte rates were: three
# runs without a model and one per zoo family, Mixtral's and Mamba's included (23 runs;
# benchmarks/results/rates-cpu-zen5-20261205.json), each operator timed as itself (the
# runs of 2026-12-04, rates-cpu-amd-epyc-20261204.json, timed an operator that shares
# its arguments with an earlier one as that one: tanh at a sigmoid's 22 GB/s, not its
# own 4 GB/s).
_ZEN5 = DeviceRates(
    device_type="cpu",
    source="built-in",
    matmul_flops=1.12e11,
    attention_flops=9.04e10,
    convolution_flops=2.3e11,
    memory_bytes=6.27e10,
    random_bytes=9.2e08,
    call_seconds=8.28e-07,
    policy_call_seconds=2.22e-05,
    policy_kept_seconds=2.16e-05,
    hook_seconds=2.15e-06,
    replay_seconds=3.05e-05,
    # Timed packing one mask in a loop, every element checked, as calibrate_rates did
    # until 2026-12-06 (it now times masks through the grain's wrapper, unchecked, as a
    # step packs them: on the Xeon 1.51 GB/s became 2.45); kept until this host is
    # measured again.
    pack_bytes=3.67e09,
    # Its calls' machinery was timed on calls that save 2 tensors, and its cost per
    # further tensor not apart from it (region_tensor_seconds, added 2026-12-06, after
    # this host was measured): 0 prices a checkpoint there as it was measured.
    region_seconds=0.00013,
    saved_call_seconds=2.38e-05,
    operator_bytes={
        "aten._log_softmax.default": 2.11e10,
        "aten._log_softmax_backward_data.default": 5.13e10,
        "aten._safe_softmax.default": 5.35e09,
        "aten._softmax.default": 1.78e10,
        "aten._softmax_backward_data.default": 6.2e10,
        "aten._to_copy.default": 3.08e10,
        "aten.abs.default": 9.06e10,
        "aten.add.Tensor": 9.19e10,
        "aten.add_.Tensor": 5.01e10,
        "aten.bitwise_and.Tensor": 1.07e11,
        "aten.cat.default": 5e10,
        "aten.clone.default": 5.68e10,
        "aten.copy_.default": 2.24e10,
        "aten.div.Scalar": 2.48e10,
        "aten.div.Tensor": 7.93e10,
        "aten.div_.Scalar": 4.82e10,
        "aten.embedding.default": 8.39e10,
        "aten.embedding_dense_backward.default": 3.3e10,
        "aten.exp.default": 8.87e09,
        "aten.full_like.default": 1.21e11,
        "aten.gather.default": 1.82e10,
        "aten.gelu.default": 1.95e10,
        "aten.gelu_backward.default": 1.5e10,
        "aten.index.Tensor": 1.75e10,
        "aten.index_put.default": 1.7e10,
        "aten.mean.dim": 5.64e10,
        "aten.minimum.default": 1.01e11,
        "aten.mul.Scalar": 8.51e10,
        "aten.mul.Tensor": 8.79e10,
        "aten.native_batch_norm.default": 6.31e09,
        "aten.native_batch_norm_backward.default": 2.05e10,
        "aten.native_group_norm.default": 3.46e10,
        "aten.native_group_norm_backward.default": 4.13e10,
        "aten.native_layer_norm.default": 2.07e10,
        "aten.native_layer_norm_backward.default": 4.1e10,
        "aten.neg.default": 1.09e11,
        "aten.new_zeros.default": 8.46e10,
        "aten.nll_loss_backward.default": 1.13e11,
        "aten.nll_loss_forward.default": 3.53e11,
        "aten.ones_like.default": 1.52e11,
        "aten.pow.Tensor_Scalar": 9.35e10,
        "aten.relu.default": 9.63e10,
        "aten.roll.default": 3.31e10,
        "aten.scatter_add.default": 2.2e10,
        "aten.select_backward.default": 3.75e10,
        "aten.sigmoid.default": 3.68e10,
        "aten.sigmoid_backward.default": 9.45e10,
        "aten.silu.default": 3.61e10,
        "aten.silu_backward.default": 4.14e10,
        "aten.slice_backward.default": 4.36e10,
        "aten.softplus.default": 7.53e09,
        "aten.softplus_backward.default": 4.1e10,
        "aten.stack.default": 4.3e10,
        "aten.sub.Tensor": 8.84e10,
        "aten.sum.dim_IntList": 4.63e10,
        "aten.tanh.default": 3.88e09,
        "aten.tanh_backward.default": 1.18e11,
        "aten.threshold_backward.default": 6.57e10,
        "aten.upsample_nearest2d.default": 5.7e10,
        "aten.upsample_nearest2d_backward.default": 4.82e10,
        "aten.where.self": 1.58e09,
    },
)

# An accelerator with a host of its own: rates of a current data-centre GPU (dense
# fp32/tf32 products, HBM bandwidth) and the launch cost of an eager kernel. Plans are
# decided by ratios of these, so the scale matters less than the proportions.
_ACCELERATOR = DeviceRates(
    device_type="accelerator",
    source="built-in",
    matmul_flops=200e12,
    attention_flops=150e12,
    convolution_flops=100e12,
    memory_bytes=2.0e12,
    random_bytes=1.0e12,
    call_seconds=8e-6,
    policy_call_seconds=25e-6,
    policy_kept_seconds=10e-6,
    hook_seconds=15e-6,
    # Not measured on an accelerator yet: calibrate_rates measures them there.
    region_seconds=REGION_SECONDS,
    saved_call_seconds=SAVED_CALL_SECONDS,
)


#: The built-in CPU tables, the fallback first: a host whose processor none matches
#: takes ``CPU_TABLES[0]``.
CPU_TABLES: tuple[CpuTable, ...] = (
    CpuTable(
        processor="Intel Xeon",
        measured_on="an Intel Xeon host (2 vCPUs under KVM), 2026-12-06",
        matches=lambda cpu: cpu.vendor == "GenuineIntel" and "xeon" in cpu.name.lower(),
        rates=_XEON,
    ),
    CpuTable(
        processor="AMD Zen 5 (CPU family 26)",
        measured_on="an AMD EPYC host of CPU family 26 (2 vCPUs under KVM), 2026-12-05",
        matches=lambda cpu: cpu.vendor == "AuthenticAMD" and cpu.family == 26,
        rates=_ZEN5,
    ),
)


def cpu_table(processor: HostProcessor | None = None) -> CpuTable:
    """The CPU table for ``processor`` (``None``: this host's), else the first one."""
    processor = host_processor() if processor is None else processor
    return next((t for t in CPU_TABLES if t.matches(processor)), CPU_TABLES[0])


def cpu_table_note(processor: HostProcessor | None = None) -> str:
    """The plan's note on the built-in CPU table taken for ``processor`` (``None``: this host's).

    Empty where the host's processor is the table's; otherwise a sentence that names the
    processor, the table taken and how to measure the host's own rates.
    """
    processor = host_processor() if processor is None else processor
    table = cpu_table(processor)
    if table.matches(processor):
        return ""
    return (
        f"Built-in CPU rates of {table.measured_on}: no built-in table was measured on "
        f"this host's processor ({processor.name or 'unknown'}), so its estimates may "
        "be off; checkpointing.calibrate_rates(save=True) measures this host's rates "
        "once, and later plans take them."
    )


def builtin_rates(device_type: str, processor: HostProcessor | None = None) -> DeviceRates:
    """The built-in rates for ``device_type``: a CPU table, else an accelerator's.

    Args:
        device_type: A ``torch.device`` type (``"cpu"`` or an accelerator's).
        processor: For ``"cpu"``, the processor to take the table of (``None``: this
            host's, :func:`host_processor`); a processor no table was measured on takes
            the first of :data:`CPU_TABLES`.

    Returns:
        The rates, with ``source="built-in"``.
    """
    if device_type == "cpu":
        return cpu_table(processor).rates
    return replace(_ACCELERATOR, device_type=device_type)
