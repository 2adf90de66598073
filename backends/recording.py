"""The ``recording`` backend: a CPU backend that records every protocol call, for tests.

Select it with ``ACCEL=recording`` or ``get_backend("recording")``, or build one around
any backend with ``RecordingBackend(inner)``. Auto-detection never picks it.

Example::

    backend = RecordingBackend()
    checkpoint(fn, x, backend=backend).sum().backward()
    backend.assert_order("mark_step", "set_rng_state")
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from accel import Accelerator, BackendSpec, copy_engines, hookimpl, protocol_members

from ._common import one_host_device
from .cpu import CpuBackend

__all__ = ["Call", "RecordingBackend", "accel_backends"]


@dataclass(frozen=True)
class Call:
    """One recorded protocol call: the member's name and its arguments."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: tuple[tuple[str, Any], ...] = ()


class RecordingBackend:
    """Delegates every :class:`accel.Accelerator` member to ``inner`` and records calls.

    Attributes (``name``, ``device_type``, the capability flags) are read through
    without being recorded; every method call, including ``Stream()`` and ``Event()``,
    is appended to :attr:`calls` in order. Thread-safe.

    Args:
        inner: The backend that does the work (default: a new ``cpu`` backend).
    """

    name = "recording"

    def __init__(self, inner: Accelerator | None = None) -> None:
        self._inner: Accelerator = inner if inner is not None else CpuBackend()
        self._lock = threading.Lock()
        self.calls: list[Call] = []

    if TYPE_CHECKING:
        # For type checkers: the protocol members are installed on the class below.
        def __getattr__(self, member: str) -> Any: ...

    def _delegate(self, member: str) -> Any:
        value = getattr(self._inner, member)
        # Attributes (name, device_type, capability flags) are values, not calls.
        if not callable(value):
            return value
        return self._recorder(member, value)

    def _recorder(self, member: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def record_and_call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.calls.append(Call(member, args, tuple(sorted(kwargs.items()))))
            return method(*args, **kwargs)

        record_and_call.__name__ = member
        return record_and_call

    @property
    def copy_engines(self) -> int:
        """The inner backend's :func:`accel.copy_engines` (read through, not recorded)."""
        return copy_engines(self._inner)

    @property
    def inner(self) -> Accelerator:
        """The backend that does the work."""
        return self._inner

    def call_names(self) -> list[str]:
        """Return the names of the recorded calls, in order."""
        with self._lock:
            return [call.name for call in self.calls]

    def count(self, member: str) -> int:
        """Return how many times ``member`` was called."""
        return self.call_names().count(member)

    def clear(self) -> None:
        """Forget the recorded calls."""
        with self._lock:
            self.calls.clear()

    def assert_order(self, *members: str) -> None:
        """Assert that ``members`` were called in this order (other calls may come between).

        Raises:
            AssertionError: Naming the first member not found after the previous one,
                with the full call list.
        """
        names = self.call_names()
        position = 0
        for member in members:
            try:
                position = names.index(member, position) + 1
            except ValueError:
                raise AssertionError(
                    f"expected {member!r} after {list(members[: members.index(member)])} "
                    f"in the recorded calls, but it is not there. Calls: {names}"
                ) from None

    def assert_not_called(self, *members: str) -> None:
        """Assert that none of ``members`` was called."""
        called = sorted(set(members) & set(self.call_names()))
        if called:
            raise AssertionError(f"expected no calls to {called}, calls: {self.call_names()}")

    def __repr__(self) -> str:
        return f"RecordingBackend(inner={self._inner!r}, calls={len(self.calls)})"


class _Delegated:
    """One protocol member on the class, read through :meth:`RecordingBackend._delegate`.

    Members live on the class, not in ``__getattr__``, because ``isinstance`` against a
    runtime-checkable protocol looks them up statically since Python 3.12
    (``inspect.getattr_static``), which never calls ``__getattr__``.
    """

    def __init__(self, member: str) -> None:
        self.member = member

    def __get__(self, instance: RecordingBackend | None, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return instance._delegate(self.member)


for _member in protocol_members():
    if _member != "name":
        setattr(RecordingBackend, _member, _Delegated(_member))


@hookimpl
def accel_backends() -> Sequence[BackendSpec]:
    """Provide the ``recording`` backend (never auto-detected)."""
    return [
        BackendSpec(
            name="recording",
            factory=RecordingBackend,
            probe=one_host_device,
            description="CPU backend that records every protocol call (for tests).",
            priority=-100,
        )
    ]
