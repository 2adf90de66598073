"""The error raised when checkpointing cannot give the plain run's result."""

from __future__ import annotations

from accel import AccelError

__all__ = ["CheckpointError"]


class CheckpointError(AccelError, RuntimeError):
    """A checkpointed region cannot be recomputed exactly, or was used in a way it cannot be.

    It derives from :class:`RuntimeError`, like the errors ``torch.utils.checkpoint``
    raises, so code that catches those keeps working. Messages start with
    ``checkpointing:`` and say what was wrong, what was expected and what to do.
    """
