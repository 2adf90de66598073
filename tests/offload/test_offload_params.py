"""offload_parameters on models with branches, skips and reentrant checkpoints.

Comparisons are bit-exact: every kernel sees the same values as without offload, and
gradients accumulate in the same order (on the device, then copied to the host).
Each test runs without copies (device = host, the hooks and state machine only) and
with every copy made, the path accelerators take.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

import accel
from checkpointing import checkpoint
from offload import OffloadConfigError, OffloadStateError, State, offload_parameters
from offload._params.swap import SwapData
from offload._state import StateMachine


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.a = nn.Linear(width, width)
        self.b = nn.Linear(width, width)
        self.gate = nn.Parameter(torch.linspace(0.5, 1.5, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.tanh(self.a(x))) * self.gate


class Residual(nn.Module):
    """Skip connections, a branch, dropout, a submodule called twice, optional checkpoints."""

    def __init__(self, checkpointed: bool | str = False) -> None:
        super().__init__()
        self.checkpointed = checkpointed
        self.embed = nn.Linear(6, 8)
        self.blocks = nn.ModuleList([Block(8) for _ in range(3)])
        self.side = nn.Linear(8, 8)
        self.shared = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)
        self.drop = nn.Dropout(0.25)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        skip = h
        for block in self.blocks:
            if self.checkpointed:
                reentrant = self.checkpointed != "non-reentrant"
                h = checkpoint(block, h, use_reentrant=reentrant)
            else:
                h = block(h)
        branch = torch.relu(self.side(skip))
        h = self.shared(self.drop(h)) + self.shared(branch)  # one module, two calls
        return self.head(h + skip)


def make(checkpointed: bool | str = False, seed: int = 0) -> Residual:
    torch.manual_seed(seed)
    return Residual(checkpointed)


def run_steps(
    model: nn.Module, steps: int = 3, micro: int = 2, seed: int = 11
) -> list[torch.Tensor]:
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    outputs = []
    for step in range(steps):
        torch.manual_seed(seed + step)
        for _ in range(micro):
            x = torch.randn(5, 6)
            out = model(x)
            out.square().mean().backward()
            outputs.append(out.detach().clone())
        outputs.extend(p.grad.clone() for p in model.parameters() if p.grad is not None)
        optimizer.step()
        optimizer.zero_grad()
    return outputs


def assert_all_equal(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    assert len(actual) == len(expected)
    for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert torch.equal(a, e), f"tensor {index} differs by {(a - e).abs().max()}"


@pytest.mark.parametrize("prefetch", [0, 1, 2])
@pytest.mark.parametrize(
    "checkpointed", [False, True, "non-reentrant"], ids=["eager", "reentrant", "non-reentrant"]
)
def test_parity_with_plain_model(copy_mode: bool, checkpointed: bool | str, prefetch: int) -> None:
    expected = run_steps(make(checkpointed))
    plain = make(checkpointed)
    run_steps(plain)
    model = make(checkpointed)
    handle = offload_parameters(model, prefetch=prefetch)
    actual = run_steps(model)
    assert_all_equal(actual, expected)
    assert_all_equal(list(model.parameters()), list(plain.parameters()))
    assert handle.state is State.IDLE and handle.is_home()
    assert set(handle.states.values()) == {State.IDLE}
    # Nested modules (a block and its linears) plus `prefetch` waiting ones.
    assert handle.max_resident <= 2 + prefetch
    assert handle.execution_order[:3] == (
        "module 'embed' (Linear)",
        "module 'blocks.0' (Block)",
        "module 'blocks.0.a' (Linear)",
    )
    handle.remove()


def test_remove_restores_the_module_exactly(copy_mode: bool) -> None:
    model = make()
    reference = copy.deepcopy(model)
    parameters = list(model.parameters())
    handle = offload_parameters(model, prefetch=1)
    run_steps(model, steps=1)
    run_steps(reference, steps=1)
    x = torch.randn(2, 6)
    for module in (model, reference):
        torch.manual_seed(3)
        module(x).sum().backward()
    handle.remove()
    assert list(model.parameters()) == parameters  # the same Parameter objects
    for (name, mine), (_, theirs) in zip(
        model.state_dict().items(), reference.state_dict().items(), strict=True
    ):
        assert torch.equal(mine, theirs), name
        assert mine.device == theirs.device and mine.stride() == theirs.stride(), name
    for mine, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        assert mine.grad is not None and theirs.grad is not None
        assert torch.equal(mine.grad, theirs.grad)
        assert mine.requires_grad == theirs.requires_grad
    for module in model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks
    for parameter in model.parameters():
        assert not parameter._post_accumulate_grad_hooks
    # Training on goes exactly like the model that was never offloaded.
    assert_all_equal(run_steps(model), run_steps(reference))
    handle.remove()  # idempotent
    offload_parameters(model).remove()  # can be offloaded again


def test_chosen_modules_are_offloaded_whole(copy_mode: bool) -> None:
    plain, model = make(), make()
    handle = offload_parameters(model, modules=list(model.blocks), prefetch=1)
    assert len(handle.states) == 3
    assert_all_equal(run_steps(model), run_steps(plain))
    assert handle.is_home()
    handle.remove()


def test_pre_backward_hook_fires_once_per_tensor_and_unit(copy_mode: bool) -> None:
    model = make()
    handle = offload_parameters(model)
    swap = handle.strategy
    assert isinstance(swap, SwapData) and handle.strategy_name == "swap-data"
    fired: list[str] = []
    original = swap._pre_backward

    def spy(unit: Any) -> None:
        fired.append(unit.storage.name)
        original(unit)

    swap._pre_backward = spy  # type: ignore[method-assign]
    model(torch.randn(3, 6)).sum().backward()
    # `shared` has two outputs (two calls); every other unit one.
    assert fired.count("module 'shared' (Linear)") == 2
    assert fired.count("module 'head' (Linear)") == 1
    assert handle.state is State.IDLE
    handle.remove()


def test_inner_backward_passes_do_not_end_the_step_early(copy_mode: bool) -> None:
    # The reentrant checkpoint runs a nested backward per block; a callback queued there
    # would return every unit to IDLE while the outer backward still needs them.
    model = make(checkpointed=True)
    handle = offload_parameters(model, prefetch=1)
    finished: list[tuple[State, bool]] = []
    swap = handle.strategy
    assert isinstance(swap, SwapData)
    original = swap._final_callback

    def spy() -> None:
        finished.append((model.embed.weight.grad is None, handle.state))  # type: ignore[arg-type]
        original()

    swap._final_callback = spy  # type: ignore[method-assign]
    model(torch.randn(3, 6)).sum().backward()
    # One callback, after the embedding (the first module, the last in backward) got
    # its gradient.
    assert finished == [(False, finished[0][1])]
    assert handle.state is State.IDLE and handle.is_home()
    handle.remove()


def test_the_state_machine_names_what_went_wrong() -> None:
    machine = StateMachine("module 'head' (Linear)")
    with pytest.raises(OffloadStateError) as info:
        machine.enter(State.BACKWARD_POST, why="a test")
    message = str(info.value)
    assert message.startswith("offload: module 'head' (Linear) cannot go from IDLE to ")
    assert "BACKWARD_POST (a test); from IDLE it may only enter BACKWARD_PRE, FORWARD, IDLE" in (
        message
    )
    machine.enter(State.BACKWARD_PRE)
    with pytest.raises(OffloadStateError, match="may only enter BACKWARD_POST, BACKWARD_PRE"):
        machine.enter(State.FORWARD)
    machine.enter(State.FORWARD, recomputing=True)  # a reentrant checkpoint recomputes


def test_a_parameter_used_outside_its_module_is_caught(copy_mode: bool) -> None:
    model = make()
    handle = offload_parameters(model)
    model(torch.randn(2, 6))  # learn the order
    with pytest.raises(OffloadStateError, match=r"module 'head' \(Linear\) received a gradient"):
        (model.head.weight * 2).sum().backward()
    handle.recover()
    assert handle.state is State.IDLE and handle.is_home()
    handle.remove()


def test_remove_during_forward_is_refused() -> None:
    model = make()
    handle = offload_parameters(model)
    errors: list[Exception] = []

    def try_remove(module: nn.Module, args: Any) -> None:
        try:
            handle.remove()
        except OffloadStateError as exc:
            errors.append(exc)

    model.head.register_forward_pre_hook(try_remove)
    model(torch.randn(2, 6)).sum().backward()
    assert errors and "between steps" in str(errors[0])
    handle.remove()


def test_configuration_errors() -> None:
    model = make()
    with pytest.raises(OffloadConfigError, match="prefetch must be an int >= 0"):
        offload_parameters(model, prefetch=-1)
    handle = offload_parameters(model)
    with pytest.raises(OffloadConfigError, match="already has its parameters offloaded"):
        offload_parameters(model.blocks[0])
    handle.remove()
    with pytest.raises(OffloadConfigError, match="not available to backend 'cpu'"):
        offload_parameters(make(), device="meta")
    offload_parameters(make(), backend="recording").remove()  # a backend name works
    with pytest.raises(accel.AccelTypeError, match=r"^offload: backend must be an accel backend"):
        offload_parameters(make(), backend=object())  # type: ignore[arg-type]


def test_a_dropped_model_is_not_kept_alive() -> None:
    import gc
    import weakref

    model = make()
    handle = offload_parameters(model)
    model(torch.randn(2, 6)).sum().backward()
    model_ref, handle_ref = weakref.ref(model), weakref.ref(handle)
    del model, handle
    gc.collect()
    assert model_ref() is None and handle_ref() is None
