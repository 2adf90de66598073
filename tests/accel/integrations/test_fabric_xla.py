"""Fabric on PyTorch/XLA through accel (CI's xla cell: torch_xla 2.9, ``PJRT_DEVICE=CPU``).

Lightning's own ``XLAAccelerator`` runs only on TPUs; accel's ``xla`` backend runs on
whatever client torch_xla picks, including its CPU client, so a hand-written Fabric loop
trains there through :func:`accel.integrations.lightning.fabric_kwargs`, with the graph
cut after every ``fabric.backward`` and optimizer step.
"""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

import accel

pytest.importorskip("lightning", reason="Lightning is not installed (pip install '.[lightning]')")

from accel.integrations.lightning import AccelFabricSingleDeviceStrategy, fabric_kwargs
from backends.recording import RecordingBackend


def test_fabric_trains_on_xla_through_accel(xla: accel.Accelerator, common: ModuleType) -> None:
    backend = RecordingBackend(xla)  # counts the protocol calls, XLA does the work
    model = common.make_model()
    marks: list[tuple[str, int]] = []
    fabric = common.fabric_sgd(
        fabric_kwargs(backend),
        model,
        common.batches(),
        note=lambda where: marks.append((where, backend.count("mark_step"))),
    )

    assert isinstance(fabric.strategy, AccelFabricSingleDeviceStrategy)
    assert fabric.device.type == "xla"
    assert {parameter.device.type for parameter in model.parameters()} == {"xla"}
    expected = []
    for step in range(common.STEPS):  # graph cuts after each backward and optimizer step
        expected += [("backward", 2 * step + 1), ("step", 2 * step + 2)]
    assert marks == expected
    reference = common.plain_sgd(common.make_model(), common.batches())
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        # XLA's CPU client compiles the step: fused kernels round differently.
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)


def test_fabric_by_registered_names_on_xla(
    xla: accel.Accelerator, common: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCEL", "xla")
    model = common.make_model()
    arguments = {"accelerator": "accel", "strategy": "accel_single_device", "devices": 1}
    fabric = common.fabric_sgd(arguments, model, common.batches())

    assert fabric.accelerator.backend is xla and fabric.device.type == "xla"
    reference = common.plain_sgd(common.make_model(), common.batches())
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
