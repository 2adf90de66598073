"""DeepSpeed on any accel backend: a complete ``DeepSpeedAccelerator`` from the protocol.

Example::

    import deepspeed
    from accel.integrations.deepspeed import install

    install()  # before deepspeed.init_distributed() and deepspeed.initialize()
    engine, optimizer, _, _ = deepspeed.initialize(model=model, config=config, ...)

**When to call** :func:`install`: before DeepSpeed uses its accelerator, i.e. before
``deepspeed.init_distributed()``, ``deepspeed.initialize()`` and anything else that
creates DeepSpeed state, and ideally right after ``import deepspeed``. Importing
DeepSpeed (any of its modules) detects an accelerator of its own (CPU where it finds no
device it knows) and a few of its modules keep what they found: the memory-report
helpers of ``deepspeed.runtime.utils`` (``see_memory_usage``) and the op builder list
of ``deepspeed.ops.op_builder.all_ops``. Training does not use either. A call after the
communication backend exists (``deepspeed.comm.is_initialized()``) is too late for what
was set up with the old accelerator, and warns with :class:`DeepSpeedInstallWarning`.

Needs ``pip install 'accel-hal[deepspeed]'`` (DeepSpeed 0.19; it ships as a source
distribution whose setup imports torch; see docs/deepspeed.md).
"""

from __future__ import annotations

import warnings
from typing import Any

from deepspeed.accelerator import get_accelerator, set_accelerator
from deepspeed.accelerator.abstract_accelerator import DeepSpeedAccelerator
from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

from ..._errors import AccelError
from ..._protocol import Accelerator
from ..._resolve import resolve_backend
from ._answers import ProtocolAnswers

__all__ = [
    "DeepSpeedAdapterError",
    "DeepSpeedInstallWarning",
    "accelerator",
    "accelerator_class",
    "install",
]

_PREFIX = "accel.integrations.deepspeed: "


class DeepSpeedAdapterError(AccelError, TypeError):
    """The installed DeepSpeed declares accelerator methods this adapter does not answer."""


class DeepSpeedInstallWarning(UserWarning):
    """:func:`install` ran after DeepSpeed had already set up state with another accelerator."""


def accelerator_class(base: type = DeepSpeedAccelerator) -> type:
    """Return the ``DeepSpeedAccelerator`` subclass answering from the protocol.

    Args:
        base: DeepSpeed's abstract accelerator class (the installed one by default).

    Raises:
        DeepSpeedAdapterError: ``base`` declares abstract methods this adapter has no
            answer for (a DeepSpeed newer than this accel), named in the message.
    """
    cls = type("AccelDeepSpeedAccelerator", (ProtocolAnswers, base), {"__module__": __name__})
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        import deepspeed

        raise DeepSpeedAdapterError(
            f"{_PREFIX}DeepSpeed {deepspeed.__version__} declares accelerator methods accel "
            f"does not answer: {', '.join(missing)}. Install the DeepSpeed release this accel "
            "supports (pip install 'accel-hal[deepspeed]') or upgrade accel."
        )
    return cls


def accelerator(backend: str | Accelerator | None = None) -> Any:
    """Return a ``DeepSpeedAccelerator`` for ``backend``, complete for the installed DeepSpeed.

    Device, RNG, streams, events, memory, dtypes, the communication and compile backends
    come from the protocol; members the protocol has no counterpart for give DeepSpeed's
    CPU accelerator's neutral answer (each member's docstring says which).

    Args:
        backend: A backend name, a backend object, or ``None`` for ``accel.get_backend()``.

    Raises:
        DeepSpeedAdapterError: See :func:`accelerator_class`.
        accel.AccelTypeError, accel.BackendNotFoundError, accel.BackendUnavailableError:
            ``backend`` is not a backend, names none, or names one unusable here.
    """
    resolved = resolve_backend(backend, "accel.integrations.deepspeed")
    instance = accelerator_class()()
    instance.backend = resolved
    instance._neutral = CPU_Accelerator()
    instance._name = resolved.name
    instance._communication_backend_name = resolved.communication_backend
    instance._compile_backend = resolved.compile_backend
    return instance


def install(backend: str | Accelerator | None = None) -> Any:
    """Make DeepSpeed use ``backend`` (``deepspeed.accelerator.set_accelerator``).

    Call it before ``deepspeed.init_distributed()`` and ``deepspeed.initialize()`` (see
    the module docstring for why and what importing DeepSpeed already fixed).

    Args:
        backend: A backend name, a backend object, or ``None`` for ``accel.get_backend()``.

    Returns:
        The accelerator now installed (what ``deepspeed.accelerator.get_accelerator()``
        returns).

    Warns:
        DeepSpeedInstallWarning: DeepSpeed's communication backend was already initialised,
            with the accelerator it had then.
    """
    import deepspeed.comm

    installed = accelerator(backend)
    if deepspeed.comm.is_initialized():
        previous = get_accelerator()
        warnings.warn(
            f"{_PREFIX}install() ran after DeepSpeed initialised its communication backend "
            f"with the {getattr(previous, '_name', type(previous).__name__)} accelerator; what "
            f"was set up then stays on it. Call install() before deepspeed.init_distributed() "
            "and deepspeed.initialize().",
            DeepSpeedInstallWarning,
            stacklevel=2,
        )
    set_accelerator(installed)
    return installed
