"""The errors offload raises.

Every one derives from :class:`OffloadError`, itself an :class:`accel.AccelError`, and
also from the builtin that best describes it, so code that catches ``ValueError`` or
``TypeError`` keeps working::

    OffloadError (also RuntimeError)
    ├── OffloadConfigError (also ValueError)   an argument that cannot work
    ├── UnsupportedModelError (also TypeError) a model OffloadModel cannot split
    └── OffloadStateError                      a hook fired in a state it may not fire in

Messages start with ``offload:`` and say what was received, what was expected and what
to do instead.
"""

from __future__ import annotations

from accel import AccelError

__all__ = ["OffloadConfigError", "OffloadError", "OffloadStateError", "UnsupportedModelError"]


class OffloadError(AccelError, RuntimeError):
    """Root of every error raised by offload."""


class OffloadConfigError(OffloadError, ValueError):
    """An argument that cannot work: too many slices, an unusable device, a missing optimizer."""


class UnsupportedModelError(OffloadError, TypeError):
    """A model :class:`offload.OffloadModel` cannot split into sequential slices."""


class OffloadStateError(OffloadError):
    """A forward or backward hook fired in a state that does not allow it.

    The message names the module, the state it was in, the state it was asked to
    enter and the states it may enter from there. It usually means a parameter was
    used outside its module's forward, or a hook of another library reordered the
    autograd graph.
    """
