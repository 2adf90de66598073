"""Errors and warnings raised by accel.

Every error accel raises derives from :class:`AccelError`, so ``except AccelError``
catches all of them. Each also derives from the builtin that best describes it, so
code that already catches ``LookupError`` or ``RuntimeError`` keeps working::

    AccelError
    ├── AccelTypeError             (also TypeError)     an argument of the wrong type
    ├── BackendNotFoundError       (also LookupError)   no backend has that name
    ├── BackendUnavailableError    (also RuntimeError)  known, but unusable on this machine
    ├── ConfigurationError         (also ValueError)    an environment variable accel rejects
    ├── DeviceIndexError           (also ValueError)    a device index this backend does not have
    ├── DistributedSetupError      (also RuntimeError)  torchrun environment missing or inconsistent
    └── PluginError                                     a backend plugin is broken
        ├── PluginLoadError                             importing it or calling its hook failed
        ├── BackendConflictError                        two plugins provide the same name
        └── ProtocolViolationError (also TypeError)     its object lacks Accelerator members

    UserWarning
    ├── PluginLoadWarning          a broken plugin was skipped (the others keep working)
    └── BackendFallbackWarning     auto-detection skipped a backend that failed to start

The framework adapters (``accel.integrations``, each importing its framework) add
``LightningSetupError`` (also ValueError), ``DeepSpeedAdapterError`` (also TypeError)
and ``DeepSpeedInstallWarning`` (a UserWarning).

Messages are full sentences: the value received, what exists, and what to do next.
"""

from __future__ import annotations

__all__ = [
    "AccelError",
    "AccelTypeError",
    "BackendFallbackWarning",
    "BackendConflictError",
    "BackendNotFoundError",
    "BackendUnavailableError",
    "ConfigurationError",
    "DeviceIndexError",
    "DistributedSetupError",
    "PluginError",
    "PluginLoadError",
    "PluginLoadWarning",
    "ProtocolViolationError",
]


class AccelError(Exception):
    """Root of every error raised by accel."""


class AccelTypeError(AccelError, TypeError):
    """An argument of the wrong type, such as ``get_backend(123)``."""


class BackendNotFoundError(AccelError, LookupError):
    """No installed backend has the requested name."""


class BackendUnavailableError(AccelError, RuntimeError):
    """The backend is known but cannot run here (missing software or no device)."""


class ConfigurationError(AccelError, ValueError):
    """An environment variable accel reads holds a value it does not accept."""


class DeviceIndexError(AccelError, ValueError):
    """A device index outside what the backend offers in this process."""


class DistributedSetupError(AccelError, RuntimeError):
    """The distributed environment is missing, inconsistent, or already initialised.

    Raised by :func:`accel.distributed.init_process_group` before anything was changed:
    no device was bound and no process group exists. Messages begin with
    ``accel.distributed:``.
    """


class PluginError(AccelError):
    """A backend plugin is broken; the message names its entry point and distribution."""


class PluginLoadError(PluginError):
    """Importing a plugin's entry point or calling its ``accel_backends`` hook failed."""


class BackendConflictError(PluginError):
    """Two plugins provide a backend under the same name."""


class ProtocolViolationError(PluginError, TypeError):
    """A backend object does not provide every member of :class:`accel.Accelerator`."""


class PluginLoadWarning(UserWarning):
    """A broken plugin was skipped; set ``ACCEL_STRICT_PLUGINS=1`` to make it an error."""


class BackendFallbackWarning(UserWarning):
    """Auto-detection skipped a backend whose factory raised, and took the next one.

    Issued once per backend and process (until :func:`accel.reset_backends`). Naming
    the backend (``get_backend("hpu")`` or ``ACCEL=hpu``) raises the error instead.
    """
