"""The training state machine every offloaded unit follows, with asserted transitions.

A unit (a slice of :class:`offload.OffloadModel`, or a module handled by
:func:`offload.offload_parameters`) goes through::

    IDLE -> FORWARD -> IDLE                      forward: load, compute, drop
    IDLE -> BACKWARD_PRE -> BACKWARD_POST        backward: load, gradients to the host, drop
    BACKWARD_POST -> BACKWARD_PRE                used again later in the same backward
    BACKWARD_PRE | BACKWARD_POST -> FORWARD      only while a reentrant checkpoint recomputes,
    FORWARD -> BACKWARD_PRE                      and back, when the unit was in backward
    any state but FORWARD -> IDLE                the end of backward (the final callback)

Every other transition raises :class:`offload.OffloadStateError`, naming the unit, both
states and the allowed targets, so a hook firing out of order is caught where it
happens instead of corrupting parameters later.
"""

from __future__ import annotations

import enum

from ._errors import OffloadStateError

__all__ = ["State", "StateMachine"]


class State(enum.Enum):
    """Where an offloaded unit is in a training step."""

    IDLE = "IDLE"
    """Parameters and gradients are in host memory; nothing is in flight."""
    FORWARD = "FORWARD"
    """The unit's forward is running; its parameters are on the device."""
    BACKWARD_PRE = "BACKWARD_PRE"
    """Backward reached the unit; its parameters are on the device for its gradients."""
    BACKWARD_POST = "BACKWARD_POST"
    """Every parameter's gradient of this backward is accumulated and on its way to the host."""


_ALLOWED: dict[State, frozenset[State]] = {
    State.IDLE: frozenset({State.FORWARD, State.BACKWARD_PRE, State.IDLE}),
    State.FORWARD: frozenset({State.IDLE}),
    State.BACKWARD_PRE: frozenset({State.BACKWARD_PRE, State.BACKWARD_POST, State.IDLE}),
    State.BACKWARD_POST: frozenset({State.BACKWARD_PRE, State.IDLE}),
}
# Reentrant checkpoints rerun forward hooks in the middle of backward.
_RECOMPUTE_ONLY: dict[State, frozenset[State]] = {
    State.BACKWARD_PRE: frozenset({State.FORWARD}),
    State.BACKWARD_POST: frozenset({State.FORWARD}),
    State.FORWARD: frozenset({State.BACKWARD_PRE}),
}

_HINT = (
    "This usually means a parameter was used outside its module's forward (pass tensors "
    "between modules instead of reading another module's parameters), or that a hook of "
    "another library reordered forward and backward. Call recover() (or the next forward "
    "does it) to bring every parameter and gradient back to host memory."
)


class StateMachine:
    """The state of one unit, changed only through :meth:`enter`.

    Args:
        name: How messages name the unit (e.g. ``"slice 1 (layers 3-5)"``).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._state = State.IDLE

    @property
    def state(self) -> State:
        """The current state."""
        return self._state

    def allowed(self, *, recomputing: bool = False) -> frozenset[State]:
        """Return the states reachable from the current one."""
        targets = _ALLOWED[self._state]
        if recomputing:
            targets = targets | _RECOMPUTE_ONLY.get(self._state, frozenset())
        return targets

    def enter(self, target: State, *, recomputing: bool = False, why: str = "") -> State:
        """Move to ``target`` and return the previous state.

        Args:
            target: The state to enter.
            recomputing: Whether a reentrant checkpoint is recomputing (it reruns forward
                hooks in the middle of backward).
            why: What triggered the transition, for the message.

        Raises:
            offload.OffloadStateError: ``target`` is not reachable from the current state.
        """
        allowed = self.allowed(recomputing=recomputing)
        if target not in allowed:
            names = ", ".join(sorted(state.name for state in allowed))
            trigger = f" ({why})" if why else ""
            raise OffloadStateError(
                f"offload: {self.name} cannot go from {self._state.name} to {target.name}"
                f"{trigger}; from {self._state.name} it may only enter {names}. {_HINT}"
            )
        previous = self._state
        self._state = target
        return previous

    def reset(self) -> State:
        """Return to IDLE unconditionally (recovery after an exception); return the old state."""
        previous = self._state
        self._state = State.IDLE
        return previous

    def __repr__(self) -> str:
        return f"StateMachine({self.name!r}, {self._state.name})"
