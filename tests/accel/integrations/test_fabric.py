"""Fabric through accel.integrations.lightning, with the real Lightning Fabric, in this process.

Hand-written loops (``common.fabric_sgd``) on the cpu and recording backends and on the
Gaudi stand-in; two-process Fabric DDP runs in test_processes.py, Fabric on XLA in
test_fabric_xla.py.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch

import accel

pytest.importorskip("lightning", reason="Lightning is not installed (pip install '.[lightning]')")

from lightning.fabric import Fabric
from lightning.fabric.accelerators import ACCELERATOR_REGISTRY
from lightning.fabric.strategies import STRATEGY_REGISTRY, SingleDeviceStrategy

from accel.integrations.lightning import (
    AccelFabricAccelerator,
    AccelFabricDDPStrategy,
    AccelFabricPrecision,
    AccelFabricSingleDeviceStrategy,
    LightningSetupError,
    fabric_kwargs,
    fabric_precision_plugin,
)


def _trained(common: ModuleType, arguments: dict[str, Any], **loop: Any) -> tuple[Any, Any]:
    """Fabric after the shared loop on the shared model, and the model."""
    model = common.make_model()
    return common.fabric_sgd(arguments, model, common.batches(), **loop), model


@pytest.mark.parametrize("route", ["fabric_kwargs", "registered name"])
def test_fabric_on_cpu_equals_a_plain_loop(common: ModuleType, route: str) -> None:
    if route == "fabric_kwargs":
        arguments = fabric_kwargs("cpu")
    else:  # the host CPU is eager: Fabric's own single-device strategy runs it right
        arguments = {"accelerator": "accel", "devices": 1}
    fabric, model = _trained(common, arguments)
    assert isinstance(fabric.accelerator, AccelFabricAccelerator)
    assert fabric.accelerator.backend is accel.get_backend()
    expected = AccelFabricSingleDeviceStrategy if route == "fabric_kwargs" else SingleDeviceStrategy
    assert type(fabric.strategy) is expected
    common.assert_equal_to_plain(model)


@pytest.mark.parametrize("route", ["fabric_kwargs", "registered names"])
def test_the_recording_backend_sees_mark_step_per_backward_and_step(
    common: ModuleType, monkeypatch: pytest.MonkeyPatch, route: str
) -> None:
    monkeypatch.setenv("ACCEL", "recording")
    backend = accel.get_backend()
    backend.clear()
    if route == "fabric_kwargs":
        arguments = fabric_kwargs()
    else:
        arguments = {"accelerator": "accel", "strategy": "accel_single_device", "devices": 1}
    seen: list[tuple[str, int]] = []
    fabric, model = _trained(
        common, arguments, note=lambda where: seen.append((where, backend.count("mark_step")))
    )
    assert fabric.strategy.backend is fabric.accelerator.backend is backend
    expected = []
    for step in range(common.STEPS):  # one after backward, one after the optimizer step
        expected += [("backward", 2 * step + 1), ("step", 2 * step + 2)]
    assert seen == expected
    backend.assert_order("set_device", "mark_step")  # launch() set the device up first
    common.assert_equal_to_plain(model)


def test_fabrics_precision_plugins_are_fabrics_own_classes(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning.fabric.plugins.precision import Precision

    assert type(fabric_precision_plugin("cpu", "32-true")) is Precision
    assert isinstance(fabric_precision_plugin("cpu", "bf16-mixed"), AccelFabricPrecision)
    monkeypatch.setenv("ACCEL", "recording")  # by name: the accel strategy swaps the plugin
    fabric = Fabric(accelerator="accel", strategy="accel_single_device", precision="bf16-mixed")
    assert isinstance(fabric.strategy.precision, AccelFabricPrecision)
    assert fabric.strategy.precision.device == "cpu"


def test_only_inputs_on_the_autocast_device_are_cast() -> None:
    plugin = AccelFabricPrecision("bf16-mixed", "meta")
    host, device = torch.ones(2), torch.ones(2, device="meta")
    converted = plugin.convert_input(
        (host, {"x": device, "index": torch.ones(2, dtype=torch.long)})
    )
    assert converted[0].dtype == torch.float32
    assert converted[1]["x"].dtype == torch.bfloat16
    assert converted[1]["index"].dtype == torch.long


def test_accel_is_registered_in_fabrics_registries() -> None:
    assert "accel" in ACCELERATOR_REGISTRY
    assert ACCELERATOR_REGISTRY["accel"]["accelerator"] is AccelFabricAccelerator
    assert STRATEGY_REGISTRY["accel_single_device"]["strategy"] is AccelFabricSingleDeviceStrategy
    assert STRATEGY_REGISTRY["accel_ddp"]["strategy"] is AccelFabricDDPStrategy


def test_fabric_kwargs_builds_ddp_with_the_backends_collectives() -> None:
    arguments = fabric_kwargs("cpu", devices=2)
    strategy = arguments["strategy"]
    assert isinstance(strategy, AccelFabricDDPStrategy)
    assert strategy.process_group_backend == "gloo"
    assert strategy._determine_ddp_device_ids() is None  # no CUDA side stream


def test_fabrics_own_strategy_is_refused_for_a_device_backend(
    common: ModuleType, habana_double: ModuleType
) -> None:
    # Fabric gives an accelerator it does not know SingleDeviceStrategy("cpu").
    with pytest.raises(
        LightningSetupError, match="Lightning chose device cpu but the hpu"
    ) as error:
        _trained(common, {"accelerator": AccelFabricAccelerator("hpu"), "devices": 1})
    assert "Fabric(**accel.integrations.lightning.fabric_kwargs(...))" in str(error.value)


def test_a_bare_loss_backward_is_refused(common: ModuleType) -> None:
    with common.framework_warnings():
        fabric = Fabric(**fabric_kwargs("cpu"))
        module = fabric.setup(common.make_model())
        x, y = common.batches()[0]
        loss = torch.nn.functional.mse_loss(module(x), y)
        with pytest.raises(RuntimeError, match=r"requires you to call `fabric\.backward"):
            loss.backward()


def test_a_strategy_and_accelerator_on_different_backends_are_refused(common: ModuleType) -> None:
    arguments = {
        "accelerator": AccelFabricAccelerator("cpu"),
        "strategy": AccelFabricSingleDeviceStrategy("recording"),
    }
    with pytest.raises(LightningSetupError, match="runs on the recording backend but the acc"):
        _trained(common, arguments)


def test_fabric_and_trainer_accelerators_are_separate_classes_per_backend() -> None:
    from accel.integrations.lightning import AccelAccelerator

    fabric, trainer = AccelFabricAccelerator("cpu"), AccelAccelerator("cpu")
    assert type(fabric).__name__ == "AccelFabricAccelerator[cpu]"
    assert type(fabric) is type(AccelFabricAccelerator("cpu")) and type(fabric) is not type(trainer)
    assert repr(fabric) == "AccelFabricAccelerator(backend='cpu')"
    assert type(fabric).get_parallel_devices(2) == [torch.device("cpu")] * 2


def test_an_optimizer_built_before_setup_steps_the_moved_parameters(common: ModuleType) -> None:
    # Moving to a device whose tensors cannot take a host tensor's place makes new
    # parameters (XLA; "meta" here): the optimizer must follow them.
    strategy = AccelFabricSingleDeviceStrategy("cpu", device="meta")
    model = common.make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=common.LR, momentum=0.9)
    host = list(model.parameters())
    optimizer.state[host[0]]["momentum_buffer"] = torch.zeros_like(host[0])
    strategy.module_to_device(model)
    moved = list(model.parameters())
    assert all(p.device.type == "meta" for p in moved)
    strategy.setup_optimizer(optimizer)
    [group] = optimizer.param_groups
    assert len(group["params"]) == len(moved)
    assert all(a is b for a, b in zip(group["params"], moved, strict=True))
    [key] = optimizer.state
    assert key is moved[0]
