"""The wrapper as a module (state dicts, copies, attributes) and the offload copy path."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch import nn

import accel
from accel.testing import RecordingBackend
from backends.cpu import CpuBackend
from checkpointing import CheckpointWrapper, apply_activation_checkpointing, checkpoint_wrapper
from checkpointing._offload import HostCopy, copy_to_host, restore, stash, wait_for_copies


def _stack() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(4, 8),
        nn.BatchNorm1d(8),
        nn.Sequential(nn.Linear(8, 8), nn.ReLU()),
        nn.Linear(8, 2),
    )


def test_state_dict_keys_are_the_plain_models() -> None:
    plain = _stack()
    wrapped = copy.deepcopy(plain)
    names = apply_activation_checkpointing(
        wrapped, check_fn=lambda m: isinstance(m, (nn.BatchNorm1d, nn.Sequential))
    )
    assert names == ["1", "2"]
    assert isinstance(wrapped[1], CheckpointWrapper) and isinstance(wrapped[2], CheckpointWrapper)
    assert list(wrapped.state_dict()) == list(plain.state_dict())
    for key, value in plain.state_dict().items():
        assert torch.equal(wrapped.state_dict()[key], value), key


def test_load_state_dict_accepts_plain_keys() -> None:
    plain = _stack()
    with torch.no_grad():
        for parameter in plain.parameters():
            parameter.add_(1.0)
    wrapped = _stack()
    apply_activation_checkpointing(wrapped)
    result = wrapped.load_state_dict(plain.state_dict(), strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    for key, value in plain.state_dict().items():
        assert torch.equal(wrapped.state_dict()[key], value), key


def test_attributes_are_read_from_the_wrapped_module() -> None:
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    wrapper = checkpoint_wrapper(layer)
    assert wrapper.module is layer
    assert wrapper.self_attn is layer.self_attn
    assert wrapper.linear1.out_features == 16
    assert list(wrapper.parameters()) == list(layer.parameters())
    assert "non-reentrant, offload_to_cpu=False" in repr(wrapper)
    with pytest.raises(AttributeError):
        _ = wrapper.no_such_attribute
    sequential = checkpoint_wrapper(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
    assert isinstance(sequential[1], nn.ReLU)


def test_shared_module_gets_one_wrapper() -> None:
    shared = nn.Linear(4, 4)
    model = nn.Sequential(shared, nn.ReLU(), shared)
    names = apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, nn.Linear))
    assert names == ["0", "2"]
    assert model[0] is model[2] and model[0].module is shared


def test_apply_does_not_nest_checkpoints() -> None:
    model = nn.Sequential(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)), nn.Linear(2, 2))
    names = apply_activation_checkpointing(model)
    assert names == ["0", "1"]
    assert not any(isinstance(m, CheckpointWrapper) for m in model[0].module.modules())
    assert apply_activation_checkpointing(model) == []  # wrappers are skipped


def test_deepcopy_shares_the_backend_and_keeps_working() -> None:
    backend = RecordingBackend()
    model = _stack()
    apply_activation_checkpointing(
        model, check_fn=lambda m: isinstance(m, nn.Linear), backend=backend
    )
    clone = copy.deepcopy(model)
    assert clone[0]._backend_ref.get() is backend
    x = torch.randn(5, 4)
    torch.manual_seed(1)
    clone(x).sum().backward()
    assert backend.count("mark_step") == 3


def test_pickle_round_trip_resolves_the_backend_by_name() -> None:
    model = _stack()
    apply_activation_checkpointing(
        model, check_fn=lambda m: isinstance(m, nn.Linear), backend=accel.get_backend("cpu")
    )
    restored = pickle.loads(pickle.dumps(model))
    assert restored[0]._backend_ref.get() is accel.get_backend("cpu")
    assert list(restored.state_dict()) == list(model.state_dict())
    restored(torch.randn(5, 4)).sum().backward()
    assert restored[0].module.weight.grad is not None


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_reentrant_wrapper_warns_like_torch_on_data_inputs(reentrant: bool) -> None:
    wrapper = checkpoint_wrapper(nn.Linear(3, 3), use_reentrant=reentrant)
    x = torch.ones(2, 3)
    if reentrant:
        with pytest.warns(UserWarning, match="None of the inputs have requires_grad=True") as rec:
            out = wrapper(x)
        assert rec[0].filename == __file__
        assert not out.requires_grad
    else:
        assert wrapper(x).requires_grad


# Offload: the copy path, with a backend that has streams and pinned memory ------------------


class _LoggingStream:
    def __init__(self, log: list[str], name: str) -> None:
        self.log = log
        self.name = name

    def wait_stream(self, stream: Any) -> None:
        self.log.append(f"{self.name}.wait_stream({stream.name})")

    def wait_event(self, event: Any) -> None:
        self.log.append(f"{self.name}.wait_event({event.name})")

    def record_event(self, event: Any = None) -> Any:
        event = _LoggingEvent(self.log, f"event{sum('record' in e for e in self.log)}")
        self.log.append(f"{self.name}.record_event -> {event.name}")
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        self.log.append(f"{self.name}.synchronize")


class _LoggingEvent:
    def __init__(self, log: list[str], name: str) -> None:
        self.log = log
        self.name = name

    def record(self, stream: Any = None) -> None:
        self.log.append(f"{self.name}.record")

    def wait(self, stream: Any = None) -> None:
        self.log.append(f"{self.name}.wait")

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        self.log.append(f"{self.name}.synchronize")


class _StreamingCpu(CpuBackend):
    """A CPU backend that claims streams and pinned memory, and logs their use."""

    name = "streaming_cpu"
    supports_streams = True
    supports_pinned_memory = True

    def __init__(self) -> None:
        self.log: list[str] = []
        self.current = _LoggingStream(self.log, "current")
        self.active: str | None = None

    @property
    def Stream(self) -> Any:  # type: ignore[override]
        def make() -> _LoggingStream:
            self.log.append("Stream()")
            return _LoggingStream(self.log, "side")

        return make

    def current_stream(self) -> Any:
        return self.current

    def stream(self, stream: Any) -> Any:
        @contextmanager
        def on(stream: Any) -> Iterator[None]:
            self.log.append(f"enter {stream.name}")
            yield
            self.log.append(f"exit {stream.name}")

        return on(stream)

    def pin_memory(self, tensor: torch.Tensor) -> torch.Tensor:
        self.log.append("pin_memory")
        return tensor.clone()

    def empty_pinned(self, shape: Any, dtype: torch.dtype) -> torch.Tensor:
        self.log.append("empty_pinned")
        return torch.empty(tuple(shape), dtype=dtype)


def test_copy_to_host_orders_the_side_stream() -> None:
    backend = _StreamingCpu()
    source = torch.arange(12.0).reshape(3, 4).requires_grad_()
    copied = copy_to_host(source, backend)
    assert isinstance(copied, HostCopy)
    assert torch.equal(copied.host, source.detach()) and copied.host is not source
    assert copied.requires_grad and copied.device == source.device
    # Allocated pinned: no pageable block that pin_memory would copy again.
    assert backend.log[:6] == [
        "empty_pinned",
        "Stream()",
        "side.wait_stream(current)",
        "enter side",
        "exit side",
        "side.record_event -> event0",
    ]
    backend.log.clear()
    wait_for_copies([copied, torch.ones(1)], backend)
    assert backend.log == ["current.wait_event(event0)"]


def test_copy_to_host_keeps_the_layout() -> None:
    backend = _StreamingCpu()
    source = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    copied = copy_to_host(source, backend)
    assert copied.host.stride() == source.stride() and torch.equal(copied.host, source)
    assert "pin_memory" not in backend.log


def test_restore_copies_back_on_the_side_stream() -> None:
    backend = _StreamingCpu()
    source = torch.arange(6.0).requires_grad_()
    copied = copy_to_host(source, backend)
    backend.log.clear()
    restored = restore(copied, backend)
    assert torch.equal(restored, source.detach()) and restored.requires_grad
    assert restored.is_leaf
    assert backend.log == [
        "side.wait_stream(current)",
        "enter side",
        "exit side",
        "side.record_event -> event0",
        "current.wait_event(event0)",
    ]


def test_side_stream_is_created_once_per_backend() -> None:
    backend = _StreamingCpu()
    for _ in range(3):
        copy_to_host(torch.ones(2), backend)
    assert backend.log.count("Stream()") == 1


def test_copy_without_streams_is_synchronous_and_exact() -> None:
    backend = CpuBackend()
    source = torch.randn(3, 3, dtype=torch.float64)
    copied = copy_to_host(source, backend)
    assert copied.copied is None and torch.equal(copied.host, source)
    assert not copied.requires_grad
    integers = restore(copy_to_host(torch.arange(4), backend), backend)
    assert integers.dtype == torch.int64 and integers.tolist() == [0, 1, 2, 3]


def test_host_tensors_are_not_copied() -> None:
    backend = _StreamingCpu()
    tensor = torch.ones(2)
    assert stash(tensor, backend) is tensor
    assert restore(tensor, backend) is tensor
    assert backend.log == []
