"""The pluggy hook through which built-in and third-party backends are provided."""

from __future__ import annotations

from collections.abc import Sequence

import pluggy

from ._spec import BackendSpec

__all__ = ["DISTRIBUTION_NAME", "PROJECT_NAME", "BackendHookSpecs", "hookimpl"]

PROJECT_NAME = "accel"
# The name on the package index; "accel" there is an unrelated chemistry package.
DISTRIBUTION_NAME = "accel-hal"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
"""Marker for plugin functions that implement accel hooks (``@accel.hookimpl``)."""


class BackendHookSpecs:
    """Hooks a backend plugin may implement."""

    @hookspec
    def accel_backends(self) -> Sequence[BackendSpec]:  # type: ignore[empty-body]
        """Return the backends this plugin provides.

        Called once per process, on the first :func:`accel.get_backend` or
        :func:`accel.list_backends`. Must be cheap and must not import vendor
        libraries: put those imports inside each :attr:`BackendSpec.factory`.
        """
