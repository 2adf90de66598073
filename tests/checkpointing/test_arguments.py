"""What users pass is checked where they pass it (issue 13, item 13)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import accel
from checkpointing import (
    apply_activation_checkpointing,
    checkpoint,
    checkpoint_sequential,
    checkpoint_wrapper,
)

MODES = [pytest.param(True, id="reentrant"), pytest.param(False, id="non_reentrant")]


@pytest.mark.parametrize("reentrant", MODES)
def test_checkpoint_accepts_a_backend_name(reentrant: bool) -> None:
    x = torch.randn(3, requires_grad=True)
    checkpoint(torch.sin, x, use_reentrant=reentrant, backend=" CPU ").sum().backward()
    assert torch.equal(x.grad, x.detach().cos())


def test_backend_names_everywhere_a_backend_is_accepted() -> None:
    x = torch.randn(2, 3, requires_grad=True)
    wrapper = checkpoint_wrapper(nn.Linear(3, 3), backend="cpu")
    wrapper(x).sum().backward()
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    assert apply_activation_checkpointing(model, backend="recording") == ["0", "1"]
    model(x).sum().backward()
    checkpoint_sequential([torch.sin, torch.cos], 2, x, use_reentrant=False, backend="cpu")


def test_unknown_backend_name_is_accels_error() -> None:
    with pytest.raises(accel.BackendNotFoundError):
        checkpoint(torch.sin, torch.ones(2), use_reentrant=False, backend="bogus")
    with pytest.raises(accel.BackendNotFoundError):
        checkpoint_wrapper(nn.Linear(2, 2), backend="bogus")


@pytest.mark.parametrize("bad", [42, ["cpu"], object()], ids=["int", "list", "object"])
def test_wrong_backend_type_is_a_checkpointing_sentence(bad: Any) -> None:
    with pytest.raises(
        TypeError, match=r"^checkpointing: backend must be an accel backend"
    ) as info:
        checkpoint(torch.sin, torch.ones(2), use_reentrant=False, backend=bad)
    assert "or None for the default backend" in str(info.value)
    assert isinstance(info.value, accel.AccelTypeError)
    with pytest.raises(TypeError, match=r"^checkpointing: backend must be"):
        checkpoint_wrapper(nn.Linear(2, 2), backend=bad)


@pytest.mark.parametrize("module", [None, "str", torch.sin], ids=["None", "str", "function"])
def test_checkpoint_wrapper_needs_a_module_at_wrap_time(module: Any) -> None:
    with pytest.raises(
        TypeError, match=r"^checkpointing: checkpoint_wrapper expects the torch\.nn\.Module"
    ) as info:
        checkpoint_wrapper(module)
    assert "checkpointing.checkpoint(function, *args)" in str(info.value)


@pytest.mark.parametrize("option", ["offload_to_cpu", "use_reentrant", "preserve_rng_state"])
def test_checkpoint_wrapper_flags_must_be_bools(option: str) -> None:
    with pytest.raises(
        TypeError, match=rf"^checkpointing: {option} must be True or False, got 'yes'"
    ):
        checkpoint_wrapper(nn.Linear(2, 2), **{option: "yes"})


def test_offload_to_cpu_positional_string_is_rejected() -> None:
    with pytest.raises(TypeError, match="offload_to_cpu must be True or False"):
        checkpoint_wrapper(nn.Linear(2, 2), "yes")  # type: ignore[arg-type]


def test_use_reentrant_must_be_a_bool_or_none() -> None:
    # torch.utils.checkpoint.checkpoint_sequential(model, 1, a, b) puts b in use_reentrant.
    a, b = torch.ones(2, requires_grad=True), torch.ones(2)
    with pytest.raises(TypeError, match=r"^checkpointing: use_reentrant must be True, False or"):
        checkpoint_sequential([torch.sin], 1, a, b)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^checkpointing: use_reentrant must be"):
        checkpoint(torch.sin, a, use_reentrant="no")  # type: ignore[arg-type]
