"""What the Trainer's adapter and Fabric's must both do, asked of each with the same test.

Each front end is a row of :data:`FRONT_ENDS`: its ``*_kwargs`` function, accelerator,
single-device strategy, precision plugin and how it trains the shared model
(``common.fit`` for the Trainer, ``common.fabric_sgd`` for Fabric).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest
import torch

import accel

pytest.importorskip("lightning", reason="Lightning is not installed (pip install '.[lightning]')")

from accel.integrations.lightning import (
    AccelAccelerator,
    AccelFabricAccelerator,
    AccelFabricSingleDeviceStrategy,
    AccelSingleDeviceStrategy,
    LightningSetupError,
    fabric_kwargs,
    fabric_precision_plugin,
    precision_plugin,
    trainer_kwargs,
)


@dataclass(frozen=True)
class FrontEnd:
    kwargs: Callable[..., dict[str, Any]]
    accelerator: type
    single_device: type
    plugin: Callable[..., Any]
    # Arguments naming accel by its registered names, with bf16-mixed by name.
    by_name: dict[str, Any]

    def precision(self, ran: Any) -> Any:
        """The precision plugin the Trainer or Fabric ``ran`` trained with."""
        return ran.precision_plugin if self.kwargs is trainer_kwargs else ran.strategy.precision

    def train(self, common: ModuleType, arguments: dict[str, Any], seen: list[Any]) -> Any:
        """Train the shared model; return (what ran it, the model)."""
        model = common.make_model()
        if self.kwargs is trainer_kwargs:
            module = common.lightning_module(model, seen)
            return common.fit(arguments, module, common.batches()), model
        return common.fabric_sgd(arguments, model, common.batches(), seen=seen), model


FRONT_ENDS = {
    # The Trainer moves Lightning's own MixedPrecision(device="cuda") in the accelerator's
    # setup(); Fabric's accelerator has no such hook, its accel strategy does it.
    "trainer": FrontEnd(
        trainer_kwargs,
        AccelAccelerator,
        AccelSingleDeviceStrategy,
        precision_plugin,
        {"accelerator": "accel", "precision": "bf16-mixed", "devices": 1},
    ),
    "fabric": FrontEnd(
        fabric_kwargs,
        AccelFabricAccelerator,
        AccelFabricSingleDeviceStrategy,
        fabric_precision_plugin,
        {
            "accelerator": "accel",
            "strategy": "accel_single_device",
            "precision": "bf16-mixed",
            "devices": 1,
        },
    ),
}


@pytest.fixture(params=sorted(FRONT_ENDS))
def front(request: pytest.FixtureRequest) -> FrontEnd:
    return FRONT_ENDS[request.param]


def test_the_gaudi_stand_in_trains_lazily(
    front: FrontEnd,
    common: ModuleType,
    habana_double: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    backend = accel.get_backend("hpu")
    assert backend.is_lazy
    # torch without Habana's bridge cannot hold hpu tensors: the arithmetic runs on the
    # host, while the step boundaries, device setup and autocast go to the Gaudi double.
    arguments = {
        "accelerator": front.accelerator(backend),
        "strategy": front.single_device(backend, device="cpu"),
        "plugins": [front.plugin(backend, "bf16-mixed")],
    }
    habana_double.CALLS.clear()
    seen: list[dict[str, Any]] = []
    _, model = front.train(common, arguments, seen)

    # One after each backward, one after each optimizer step.
    assert len(habana_double.call_args("core.mark_step")) == 2 * common.STEPS
    assert len(seen) == common.STEPS
    assert all(step["hpu"] == (True, torch.bfloat16) for step in seen), seen
    assert not any(step["cpu"][0] or step["cuda"][0] for step in seen), seen
    common.assert_equal_to_plain(model)  # hpu autocast leaves host arithmetic alone


@pytest.mark.parametrize("route", ["*_kwargs", "registered names"])
def test_bf16_mixed_autocasts_on_the_backends_device(
    front: FrontEnd, common: ModuleType, monkeypatch: pytest.MonkeyPatch, route: str
) -> None:
    monkeypatch.setenv("ACCEL", "recording")
    arguments = front.kwargs(precision="bf16-mixed") if route == "*_kwargs" else front.by_name
    seen: list[dict[str, Any]] = []
    ran, _ = front.train(common, arguments, seen)

    assert ran.accelerator.backend.name == "recording"
    assert front.precision(ran).device == "cpu"
    assert len(seen) == common.STEPS
    for step in seen:
        assert step["cpu"] == (True, torch.bfloat16)
        assert not step["cuda"][0]
        assert step["out_dtype"] == torch.bfloat16


def test_16_mixed_scales_on_the_backends_device_where_it_computes_in_fp16(
    front: FrontEnd, habana_double: ModuleType
) -> None:
    plugin = front.plugin("cpu", "16-mixed")
    assert plugin.device == "cpu"
    assert isinstance(plugin.scaler, torch.amp.GradScaler)
    assert plugin.scaler._device == "cpu"
    assert front.plugin("hpu", "16-mixed").scaler._device == "hpu"

    habana_double.FP16_SUPPORTED = False  # Gaudi1
    with pytest.raises(LightningSetupError, match="needs float16, which the hpu backend"):
        front.plugin("hpu", "16-mixed")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"devices": 0}, "devices=0 is not a device selection"),
        ({"devices": [3]}, r"devices=\[3\] is not a device selection"),
        ({"devices": "[3]"}, r"devices='\[3\]' is not a device selection"),
        ({"precision": "64-true"}, "precision='64-true' is not supported"),
    ],
)
def test_bad_arguments_say_what_to_pass(
    front: FrontEnd, arguments: dict[str, Any], message: str
) -> None:
    with pytest.raises(LightningSetupError, match=message):
        front.kwargs(**arguments)
