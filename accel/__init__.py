"""accel: one Accelerator protocol for PyTorch training on CPU, CUDA, Gaudi and more.

Example::

    from accel import get_backend

    backend = get_backend()          # explicit name > ACCEL > auto-detection
    model.to(backend.device())
    backend.mark_step()              # flushes Gaudi's lazy graph; a no-op elsewhere

Importing accel loads no plugin, initialises no device and imports no vendor library.
"""

from __future__ import annotations

from ._discovery import PluginFailure, Provider
from ._errors import (
    AccelError,
    AccelTypeError,
    BackendConflictError,
    BackendFallbackWarning,
    BackendNotFoundError,
    BackendUnavailableError,
    ConfigurationError,
    DeviceIndexError,
    DistributedSetupError,
    PluginError,
    PluginLoadError,
    PluginLoadWarning,
    ProtocolViolationError,
)
from ._hookspecs import hookimpl
from ._optional import (
    ATTENTION_KERNELS,
    AttentionKernel,
    CopyEngines,
    RecomputeBarrier,
    attention_kernel,
    copy_engines,
    optional_members,
    recompute_barrier,
)
from ._protocol import Accelerator, Event, Stream, protocol_members
from ._resolve import resolve_backend
from ._select import (
    BackendInfo,
    Selection,
    get_backend,
    list_backends,
    plugin_failures,
    reset_backends,
    select_backend,
)
from ._spec import Availability, BackendSpec
from ._version import __version__ as __version__

__all__ = [
    "ATTENTION_KERNELS",
    "AccelError",
    "AccelTypeError",
    "Accelerator",
    "AttentionKernel",
    "Availability",
    "BackendConflictError",
    "BackendFallbackWarning",
    "BackendInfo",
    "BackendNotFoundError",
    "BackendSpec",
    "BackendUnavailableError",
    "ConfigurationError",
    "CopyEngines",
    "DeviceIndexError",
    "DistributedSetupError",
    "Event",
    "PluginError",
    "PluginFailure",
    "PluginLoadError",
    "PluginLoadWarning",
    "ProtocolViolationError",
    "Provider",
    "RecomputeBarrier",
    "Selection",
    "Stream",
    "attention_kernel",
    "copy_engines",
    "get_backend",
    "hookimpl",
    "list_backends",
    "optional_members",
    "plugin_failures",
    "protocol_members",
    "recompute_barrier",
    "reset_backends",
    "resolve_backend",
    "select_backend",
]
