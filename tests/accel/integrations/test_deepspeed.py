"""accel.integrations.deepspeed against the installed DeepSpeed's abstract accelerator.

Training (ZeRO 1 and 2, one and two processes) runs in test_processes.py; these tests
ask the accelerator questions in this process and never initialise DeepSpeed's
communication.
"""

from __future__ import annotations

import abc
from types import ModuleType

import pytest
import torch

import accel

pytest.importorskip(
    "deepspeed",
    reason="DeepSpeed is not installed (pip install '.[deepspeed]'; its sdist needs torch first)",
)

from deepspeed.accelerator import get_accelerator, set_accelerator
from deepspeed.accelerator.abstract_accelerator import DeepSpeedAccelerator
from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

from accel.integrations.deepspeed import (
    DeepSpeedAdapterError,
    accelerator,
    accelerator_class,
    install,
)
from accel.integrations.deepspeed._answers import ProtocolAnswers


def test_every_abstract_method_of_the_installed_deepspeed_is_answered() -> None:
    declared = DeepSpeedAccelerator.__abstractmethods__
    assert len(declared) >= 65  # DeepSpeed 0.19's count; a newer one only adds
    cls = accelerator_class()
    assert not cls.__abstractmethods__
    assert declared <= set(vars(ProtocolAnswers))  # answered here, not inherited
    assert isinstance(accelerator("cpu"), DeepSpeedAccelerator)


def test_a_deepspeed_with_new_abstract_methods_gets_an_error_naming_them() -> None:
    newer = type(
        "NewerDeepSpeedAccelerator",
        (DeepSpeedAccelerator,),
        {"graph_pool_handle": abc.abstractmethod(lambda self: None)},
    )
    with pytest.raises(DeepSpeedAdapterError, match="does not answer: graph_pool_handle\\."):
        accelerator_class(newer)


def test_answers_come_from_the_protocol() -> None:
    backend = accel.get_backend("recording")
    ds = accelerator(backend)
    assert ds.device_name() == "cpu" and ds.device_name(1) == "cpu"  # one host device
    assert ds.current_device_name() == "cpu" and ds.device_count() == 1
    assert ds.communication_backend_name() == "gloo"
    assert ds.get_compile_backend() == backend.compile_backend
    assert ds.is_synchronized_device() and ds.resolves_data_dependency()
    assert ds.supported_dtypes() == [torch.float32, torch.bfloat16] + (
        [torch.float16] if backend.is_fp16_supported() else []
    )
    state = ds.get_rng_state()
    ds.default_generator(0).set_state(state)
    ds.manual_seed(3)
    assert ds.Stream is not None and ds.Event is not None
    with ds.stream(ds.current_stream()):
        event = ds.Event()
        event.record()
    assert ds.on_accelerator(torch.zeros(1)) and ds.FloatTensor([1.0]).dtype == torch.float32
    for member in ("get_rng_state", "set_rng_state", "manual_seed", "current_stream", "Event"):
        assert backend.count(member) >= 1, member


def test_the_gaudi_double_answers_as_gaudi(
    habana_double: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    habana_double.DEVICE_COUNT = 8
    habana_double.MEMORY_ALLOCATED = 4096
    ds = accelerator("hpu")
    assert ds.device_name() == "hpu" and ds.device_name(5) == "hpu:0"  # a card per process
    assert ds.communication_backend_name() == "hccl"
    assert ds.get_compile_backend() == "hpu_backend"
    assert not ds.is_synchronized_device()  # asynchronous, but the lazy graph orders work
    assert ds.resolves_data_dependency() and ds.handles_memory_backpressure()
    assert ds.memory_allocated() == 4096
    assert ds.on_accelerator(torch.zeros(1)) is False


def test_members_without_a_protocol_counterpart_give_the_cpu_accelerators_answers() -> None:
    ds, cpu = accelerator("cpu"), CPU_Accelerator()
    assert ds.create_graph() is cpu.create_graph() is None
    assert ds.range_push("x") is cpu.range_push("x") is None
    assert ds.op_builder_dir() == cpu.op_builder_dir()
    assert ds.get_op_builder("CPUAdamBuilder") is cpu.get_op_builder("CPUAdamBuilder")
    assert ds.total_memory() == cpu.total_memory()
    assert ds.memory_allocated() > 0  # the process RSS, as CPU's
    assert ds.lazy_call(lambda: 7) == 7 and ds.is_triton_supported() is False
    # Not CPU's: its shared-memory collectives would bypass backend.communication_backend.
    assert ds.create_op_builder("ShareMemCommBuilder") is None


def test_install_sets_deepspeeds_accelerator() -> None:
    previous = get_accelerator()
    try:
        installed = install("recording")
        assert get_accelerator() is installed
        assert installed.backend is accel.get_backend("recording")
    finally:
        set_accelerator(previous)


def test_a_bad_compile_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="compile backend 'nope' is not one torch knows"):
        accelerator("cpu").set_compile_backend("nope")
