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
    precision_plugin,
    trainer_kwargs,
)


def _trained(common: ModuleType, kwargs: dict[str, Any], **fit: Any) -> tuple[Any, Any]:
    model = common.make_model()
    module = common.lightning_module(model, fit.pop("seen", None))
    trainer = common.fit(kwargs, module, common.batches(), **fit)
    return trainer, model


def _assert_equal_to_plain(common: ModuleType, model: torch.nn.Module) -> None:
    reference = common.plain_sgd(common.make_model(), common.batches())
    for (name, got), expected in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert torch.equal(got, expected), name


def test_fit_with_trainer_kwargs_equals_a_plain_loop(common: ModuleType) -> None:
    trainer, model = _trained(common, trainer_kwargs())
    assert isinstance(trainer.accelerator, AccelAccelerator)
    assert trainer.accelerator.backend is accel.get_backend()
    assert isinstance(trainer.strategy, AccelSingleDeviceStrategy)
    assert trainer.global_step == common.STEPS
    _assert_equal_to_plain(common, model)


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
    _assert_equal_to_plain(common, model)


def test_the_gaudi_stand_in_trains_lazily_under_lightning(
    common: ModuleType, habana_double: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    backend = accel.get_backend("hpu")
    assert backend.is_lazy
    # torch without Habana's bridge cannot hold hpu tensors: the arithmetic runs on the
    # host, while the step boundaries, device setup and autocast go to the Gaudi double.
    kwargs = {
        "accelerator": AccelAccelerator(backend),
        "strategy": AccelSingleDeviceStrategy(backend, device="cpu"),
        "plugins": [precision_plugin(backend, "bf16-mixed")],
    }
    habana_double.CALLS.clear()
    seen: list[dict[str, Any]] = []
    _, model = _trained(common, kwargs, seen=seen)

    assert len(habana_double.call_args("core.mark_step")) == 2 * common.STEPS
    assert all(step["hpu"] == (True, torch.bfloat16) for step in seen), seen
    assert not any(step["cpu"][0] or step["cuda"][0] for step in seen), seen
    _assert_equal_to_plain(common, model)  # hpu autocast leaves host arithmetic alone


@pytest.mark.parametrize("route", ["trainer_kwargs", "registered name"])
def test_bf16_mixed_autocasts_on_the_backends_device(
    common: ModuleType, monkeypatch: pytest.MonkeyPatch, route: str
) -> None:
    monkeypatch.setenv("ACCEL", "recording")
    if route == "trainer_kwargs":
        kwargs: dict[str, Any] = trainer_kwargs(precision="bf16-mixed")
    else:  # Lightning itself would build MixedPrecision(device="cuda") for "accel"
        kwargs = {"accelerator": "accel", "precision": "bf16-mixed", "devices": 1}
    seen: list[dict[str, Any]] = []
    trainer, _ = _trained(common, kwargs, seen=seen)

    assert trainer.accelerator.backend.name == "recording"
    assert trainer.precision_plugin.device == "cpu"
    assert len(seen) == common.STEPS
    for step in seen:
        assert step["cpu"] == (True, torch.bfloat16)
        assert not step["cuda"][0]
        assert step["out_dtype"] == torch.bfloat16


def test_16_mixed_scales_on_the_backends_device_where_it_computes_in_fp16(
    habana_double: ModuleType,
) -> None:
    plugin = precision_plugin("cpu", "16-mixed")
    assert plugin.device == "cpu"
    assert isinstance(plugin.scaler, torch.amp.GradScaler)
    assert plugin.scaler._device == "cpu"
    assert precision_plugin("hpu", "16-mixed").scaler._device == "hpu"

    habana_double.FP16_SUPPORTED = False  # Gaudi1
    with pytest.raises(LightningSetupError, match="needs float16, which the hpu backend"):
        precision_plugin("hpu", "16-mixed")


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
    _assert_equal_to_plain(common, model)


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


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: trainer_kwargs(devices=0), "devices=0 is not a device selection"),
        (lambda: trainer_kwargs(devices=[3]), r"devices=\[3\] is not a device selection"),
        (lambda: trainer_kwargs(precision="64-true"), "precision='64-true' is not supported"),
    ],
)
def test_bad_arguments_say_what_to_pass(call: Any, message: str) -> None:
    with pytest.raises(LightningSetupError, match=message):
        call()


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
