"""Lightning on PyTorch/XLA through accel (CI's xla cell: torch_xla 2.9, ``PJRT_DEVICE=CPU``).

Lightning's own ``XLAAccelerator`` runs only on TPUs; accel's ``xla`` backend runs on
whatever client torch_xla picks, including its CPU client, so Lightning trains there
through :func:`accel.integrations.lightning.trainer_kwargs`.
"""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

import accel

pytest.importorskip("lightning", reason="Lightning is not installed (pip install '.[lightning]')")

from accel.integrations.lightning import trainer_kwargs
from backends.recording import RecordingBackend


def test_lightning_trains_on_xla_through_accel(xla: accel.Accelerator, common: ModuleType) -> None:
    devices: list[torch.device] = []

    backend = RecordingBackend(xla)  # counts the protocol calls, XLA does the work
    model = common.make_model()
    kwargs = trainer_kwargs(backend) | {"callbacks": [common.parameter_devices(devices)]}
    trainer = common.fit(kwargs, common.lightning_module(model), common.batches())

    assert trainer.strategy.root_device.type == "xla"
    assert devices and {device.type for device in devices} == {"xla"}  # Lightning moves back after
    assert backend.count("mark_step") == 2 * common.STEPS  # graph cuts at Lightning's step ends
    reference = common.plain_sgd(common.make_model(), common.batches())
    for got, expected in zip(model.parameters(), reference.parameters(), strict=True):
        # XLA's CPU client compiles the step: fused kernels round differently.
        torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-6)


def test_lightnings_own_xla_accelerator_refuses_a_host_without_tpus(
    torch_xla_installed: None,
) -> None:
    import lightning.pytorch as pl
    from lightning.pytorch.accelerators import XLAAccelerator
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

    assert not XLAAccelerator.is_available()  # it counts TPUs only
    with pytest.raises(MisconfigurationException, match="`XLAAccelerator` can not run on your"):
        pl.Trainer(accelerator="tpu", devices=1)
