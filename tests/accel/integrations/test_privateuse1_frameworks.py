"""Lightning and DeepSpeed on the PrivateUse1 device torch has registered, through accel.

CI's openreg cell builds PyTorch's reference device (openreg); elsewhere no device has
joined torch through PrivateUse1 and these skip, saying so. Neither framework knows the
device: Lightning trains on it through :func:`accel.integrations.lightning.trainer_kwargs`,
and DeepSpeed's accelerator answers from the generic backend.
"""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

import accel


# openreg's CPU fallback resizes mse_loss's backward output, and torch warns; the plain
# loop on the device warns the same.
@pytest.mark.filterwarnings("ignore:An output with one or more elements was resized:UserWarning")
def test_lightning_trains_on_the_device_like_plain_sgd(
    privateuse1_device: str, common: ModuleType
) -> None:
    pytest.importorskip(
        "lightning", reason="Lightning is not installed (pip install '.[lightning]')"
    )
    from accel.integrations.lightning import trainer_kwargs

    devices: list[torch.device] = []

    model = common.make_model()
    kwargs = trainer_kwargs(backend=privateuse1_device) | {
        "callbacks": [common.parameter_devices(devices)]
    }
    trainer = common.fit(kwargs, common.lightning_module(model), common.batches())

    assert trainer.strategy.root_device == torch.device(privateuse1_device, 0)
    assert devices and {device.type for device in devices} == {privateuse1_device}
    plain = common.make_model().to(privateuse1_device)
    data = [(x.to(privateuse1_device), y.to(privateuse1_device)) for x, y in common.batches()]
    reference = common.plain_sgd(plain, data)
    for got, expected in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(got.cpu(), expected.cpu())  # the device's kernels are the host's


def test_deepspeeds_accelerator_answers_for_the_device(privateuse1_device: str) -> None:
    pytest.importorskip(
        "deepspeed", reason="DeepSpeed is not installed (pip install '.[deepspeed]')"
    )
    from accel.integrations.deepspeed import accelerator

    backend = accel.get_backend(privateuse1_device)
    ds = accelerator(privateuse1_device)
    assert ds.device_name() == privateuse1_device and ds.device_name(1) == f"{privateuse1_device}:1"
    assert ds.device_count() == backend.device_count() and ds.is_available()
    assert ds.communication_backend_name() == backend.communication_backend
    if backend.supports_memory_stats:
        assert ds.memory_allocated() == backend.memory_allocated()
    else:  # DeepSpeed's CPU answer, the process's resident memory
        assert ds.memory_allocated() > 0
    assert ds.on_accelerator(torch.zeros(1, device=privateuse1_device))
    assert not ds.on_accelerator(torch.zeros(1))
    ds.manual_seed(4)
    state = ds.get_rng_state()
    ds.set_rng_state(state)
    with ds.stream(ds.Stream()):
        event = ds.Event()
        event.record()
    event.synchronize()
    ds.synchronize()
