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
from backends.privateuse1 import registered_device

NO_DEVICE = (
    "no device has joined torch through PrivateUse1 here (CI's openreg cell builds PyTorch's "
    "reference device: bash ../shared/openreg/build.sh PYTHON)"
)


@pytest.fixture
def device_name() -> str:
    name = registered_device()
    if name is None:
        pytest.skip(NO_DEVICE)
    return name


# openreg's CPU fallback resizes mse_loss's backward output, and torch warns; the plain
# loop on the device warns the same.
@pytest.mark.filterwarnings("ignore:An output with one or more elements was resized:UserWarning")
def test_lightning_trains_on_the_device_like_plain_sgd(
    device_name: str, common: ModuleType
) -> None:
    pytest.importorskip(
        "lightning", reason="Lightning is not installed (pip install '.[lightning]')"
    )
    import lightning.pytorch as pl

    from accel.integrations.lightning import trainer_kwargs

    devices: list[torch.device] = []

    class Where(pl.Callback):
        def on_train_batch_end(
            self, trainer: pl.Trainer, module: pl.LightningModule, *_: object
        ) -> None:
            devices.extend(parameter.device for parameter in module.parameters())

    model = common.make_model()
    kwargs = trainer_kwargs(backend=device_name) | {"callbacks": [Where()]}
    trainer = common.fit(kwargs, common.lightning_module(model), common.batches())

    assert trainer.strategy.root_device == torch.device(device_name, 0)
    assert devices and {device.type for device in devices} == {device_name}
    plain = common.make_model().to(device_name)
    data = [(x.to(device_name), y.to(device_name)) for x, y in common.batches()]
    reference = common.plain_sgd(plain, data)
    for got, expected in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(got.cpu(), expected.cpu())  # the device's kernels are the host's


def test_deepspeeds_accelerator_answers_for_the_device(device_name: str) -> None:
    pytest.importorskip(
        "deepspeed", reason="DeepSpeed is not installed (pip install '.[deepspeed]')"
    )
    from accel.integrations.deepspeed import accelerator

    backend = accel.get_backend(device_name)
    ds = accelerator(device_name)
    assert ds.device_name() == device_name and ds.device_name(1) == f"{device_name}:1"
    assert ds.device_count() == backend.device_count() and ds.is_available()
    assert ds.communication_backend_name() == backend.communication_backend
    if backend.supports_memory_stats:
        assert ds.memory_allocated() == backend.memory_allocated()
    else:  # DeepSpeed's CPU answer, the process's resident memory
        assert ds.memory_allocated() > 0
    assert ds.on_accelerator(torch.zeros(1, device=device_name))
    assert not ds.on_accelerator(torch.zeros(1))
    ds.manual_seed(4)
    state = ds.get_rng_state()
    ds.set_rng_state(state)
    with ds.stream(ds.Stream()):
        event = ds.Event()
        event.record()
    event.synchronize()
    ds.synchronize()
