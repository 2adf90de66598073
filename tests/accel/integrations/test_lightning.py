"""accel.integrations.lightning with the real Lightning, on CPU backends and the Gaudi double."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch

import accel

pytest.importorskip("lightning", reason="Lightning is not installed (pip install '.[lightning]')")

import lightning.pytorch as pl
from lightning.pytorch.accelerators import AcceleratorRegistry
from lightning.pytorch.strategies import StrategyRegistry

from accel.integrations.lightning import (
    AccelAccelerator,
    AccelSingleDeviceStrategy,
    LightningSetupError,
    trainer_kwargs,
)


def _trained(common: ModuleType, kwargs: dict[str, Any], **fit: Any) -> tuple[Any, Any]:
    model = common.make_model()
    module = common.lightning_module(model, fit.pop("seen", None))
    trainer = common.fit(kwargs, module, common.batches(), **fit)
    return trainer, model


def test_fit_with_trainer_kwargs_equals_a_plain_loop(common: ModuleType) -> None:
    trainer, model = _trained(common, trainer_kwargs())
    assert isinstance(trainer.accelerator, AccelAccelerator)
    assert trainer.accelerator.backend is accel.get_backend()
    assert isinstance(trainer.strategy, AccelSingleDeviceStrategy)
    assert trainer.global_step == common.STEPS
    common.assert_equal_to_plain(model)


class _MarkStepCounts(pl.Callback):
    """Reads the recording backend's mark_step count at Lightning's hooks."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.seen: list[tuple[str, int]] = []

    def _note(self, hook: str) -> None:
        self.seen.append((hook, self.backend.count("mark_step")))

    def on_before_optimizer_step(self, *args: Any) -> None:  # after backward
        self._note("before_optimizer_step")

    def on_train_batch_end(self, *args: Any) -> None:  # after the optimizer step
        self._note("train_batch_end")

    def on_validation_batch_start(self, *args: Any) -> None:
        self._note("validation_batch_start")


def test_the_recording_backend_sees_mark_step_at_every_step(common: ModuleType) -> None:
    backend = accel.get_backend("recording")
    counts = _MarkStepCounts(backend)
    kwargs = trainer_kwargs(backend)
    kwargs["callbacks"] = [counts]
    _, model = _trained(common, kwargs, validate=True)

    training = [entry for entry in counts.seen if entry[0] != "validation_batch_start"]
    expected = []
    for step in range(common.STEPS):  # one after backward, one after the optimizer step
        expected += [("before_optimizer_step", 2 * step + 1), ("train_batch_end", 2 * step + 2)]
    assert training == expected
    # Then one before each of the 2 validation steps (the count is read before the step).
    validation = [count for hook, count in counts.seen if hook == "validation_batch_start"]
    assert validation == [2 * common.STEPS, 2 * common.STEPS + 1]
    assert backend.count("mark_step") == 2 * common.STEPS + 2
    common.assert_equal_to_plain(model)


def test_accel_is_registered_and_follows_get_backend(
    common: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert "accel" in AcceleratorRegistry
    assert {"accel_single_device", "accel_ddp"} <= set(StrategyRegistry)
    monkeypatch.setenv("ACCEL", "recording")
    kwargs = {"accelerator": "accel", "strategy": "accel_single_device", "devices": 1}
    trainer, model = _trained(common, kwargs)
    assert trainer.accelerator.backend is accel.get_backend("recording")
    assert trainer.strategy.backend is trainer.accelerator.backend
    assert trainer.accelerator.backend.count("mark_step") == 2 * common.STEPS
    common.assert_equal_to_plain(model)


def test_lightnings_own_strategy_is_refused_for_a_device_backend(
    common: ModuleType, habana_double: ModuleType
) -> None:
    # Lightning gives an accelerator it does not know SingleDeviceStrategy("cpu").
    with pytest.raises(LightningSetupError, match="Lightning chose device cpu but the hpu"):
        _trained(common, {"accelerator": AccelAccelerator("hpu"), "devices": 1})


def test_devices_follow_accels_device_rule(habana_double: ModuleType) -> None:
    cpu = AccelAccelerator("cpu")
    assert type(cpu).get_parallel_devices(2) == [torch.device("cpu")] * 2
    assert type(cpu).parse_devices("-1") == 1
    habana_double.DEVICE_COUNT = 8  # the bridge sees 8 cards; each process uses its own
    hpu = AccelAccelerator("hpu")
    assert type(hpu).get_parallel_devices(2) == [torch.device("hpu", 0)] * 2
    assert type(hpu).auto_device_count() == 1
    assert type(hpu).is_available() and type(hpu).name() == "accel"


def test_each_backend_gets_its_own_class_also_for_subclasses() -> None:
    class Mine(AccelAccelerator):
        pass

    cpu, recording = Mine("cpu"), Mine("recording")
    assert isinstance(cpu, Mine) and type(cpu).__name__ == "Mine[cpu]"
    assert type(cpu) is type(Mine("cpu")) and type(cpu) is not type(recording)
    assert type(recording)().backend is recording.backend  # a bound class keeps its backend
    assert type(cpu)("recording").backend.name == "recording"


def test_a_non_backend_is_refused() -> None:
    with pytest.raises(accel.AccelTypeError, match="lacks"):
        AccelAccelerator(123)  # type: ignore[arg-type]
