"""Finding backends: built-in plugins plus entry points in the ``accel.backends`` group.

Discovery imports plugin modules and calls their ``accel_backends`` hook; it never calls
a backend's factory. One broken plugin is reported (a warning, or an error under
``ACCEL_STRICT_PLUGINS=1``) and the others keep working. Built-in backend names are
reserved: a plugin offering one is refused the same way, except the name of the generic
backend for a PrivateUse1 device, which a plugin for that device takes over (a plugin
declaring the device in ``BackendSpec.device_type`` leaves the generic backend to
selection by name only). Only pluggy's public API is
used; which distribution provided which plugin is tracked here, not read from pluggy.
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace

import pluggy

from . import _env
from ._errors import PluginLoadError, PluginLoadWarning
from ._hookspecs import PROJECT_NAME, BackendHookSpecs
from ._spec import Availability, BackendSpec
from ._version import __version__
from ._warn import warn

__all__ = [
    "BUILTIN_PLUGINS",
    "ENTRY_POINT_GROUP",
    "Catalog",
    "CatalogEntry",
    "PluginFailure",
    "Provider",
    "discover",
]

ENTRY_POINT_GROUP = "accel.backends"
BUILTIN_PLUGINS = (
    "backends.cpu",
    "backends.cuda",
    "backends.hpu",
    "backends.mps",
    "backends.privateuse1",
    "backends.recording",
    "backends.xla",
    "backends.xpu",
)
BUILTIN = "built-in"
#: The built-in backend that gives way to a plugin for the same device.
GENERIC_PLUGIN = "backends.privateuse1"


@dataclass(frozen=True)
class Provider:
    """Where a backend came from.

    Attributes:
        plugin: The entry point name (``name = module`` in the plugin's
            ``pyproject.toml``), or the module of a built-in backend.
        distribution: The installed distribution, or ``"built-in"``.
        version: The distribution's version (accel's own for built-ins).
    """

    plugin: str
    distribution: str
    version: str

    def describe(self) -> str:
        """Return a phrase naming this provider for error messages."""
        if self.distribution == BUILTIN:
            return f"built-in module {self.plugin} (accel {self.version})"
        return f"entry point {self.plugin!r} of distribution {self.distribution} {self.version}"


@dataclass(frozen=True)
class PluginFailure:
    """A plugin that could not be loaded, kept for ``python -m accel`` to show."""

    provider: Provider
    error: str


@dataclass(frozen=True)
class CatalogEntry:
    """A backend name and every provider that offered it (more than one is a conflict).

    Attributes:
        specs: Each provider's own spec, in the order of ``providers``.
        providers: Who offered the name.
    """

    specs: tuple[BackendSpec, ...]
    providers: tuple[Provider, ...]

    @property
    def spec(self) -> BackendSpec:
        """The first provider's spec (the only one unless the name is conflicted)."""
        return self.specs[0]

    @property
    def is_conflicted(self) -> bool:
        """Whether two or more plugins provide this name."""
        return len(self.providers) > 1


@dataclass(frozen=True)
class Catalog:
    """Everything discovery found, by backend name.

    Attributes:
        entries: Backends by name.
        failures: Plugins that failed to load, or offered a reserved name.
        disabled: Entry points skipped because ``ACCEL_DISABLED_PLUGINS`` names them.
        autoload: ``False`` when ``ACCEL_DISABLE_PLUGIN_AUTOLOAD`` kept every entry
            point from loading.
    """

    entries: Mapping[str, CatalogEntry]
    failures: tuple[PluginFailure, ...]
    disabled: tuple[Provider, ...] = ()
    autoload: bool = True


def accel_version() -> str:
    """Return accel's version (from ``accel/_version.py``, which the wheel's metadata reads)."""
    return __version__


def discover() -> Catalog:
    """Load every plugin and collect the backends they provide."""
    manager = pluggy.PluginManager(PROJECT_NAME)
    manager.add_hookspecs(BackendHookSpecs)
    providers: dict[str, Provider] = {}
    failures: list[PluginFailure] = []
    skipped: list[Provider] = []
    # Read every flag first: a bad value raises before any plugin is imported.
    autoload = not _env.flag("ACCEL_DISABLE_PLUGIN_AUTOLOAD")
    _env.flag("ACCEL_STRICT_PLUGINS")

    version = accel_version()
    for module_name in BUILTIN_PLUGINS:
        manager.register(importlib.import_module(module_name), name=module_name)
        providers[module_name] = Provider(module_name, BUILTIN, version)

    if autoload:
        disabled = _env.name_list("ACCEL_DISABLED_PLUGINS")
        for entry_point, provider in _iter_entry_points():
            if provider.plugin in disabled:
                skipped.append(provider)
                continue
            if _registered_as(providers, provider):
                continue
            try:
                _register_entry_point(manager, entry_point, provider)
            except Exception as exc:
                failures.append(_report_failure(provider, "could not be loaded", exc))
                continue
            providers[_plugin_key(provider)] = provider

    offered: list[tuple[Provider, list[BackendSpec]]] = []
    for hook_impl in manager.hook.accel_backends.get_hookimpls():
        provider = providers[hook_impl.plugin_name]
        try:
            offered.append((provider, _checked_specs(hook_impl.function())))
        except Exception as exc:
            failures.append(_report_failure(provider, "failed in its accel_backends hook", exc))
    # Built-ins first, so that their names are known before any plugin's are added.
    offered.sort(key=lambda item: item[0].distribution != BUILTIN)
    entries: dict[str, CatalogEntry] = {}
    for provider, specs in offered:
        for spec in specs:
            if provider.distribution != BUILTIN and _is_builtin_name(entries, spec.name):
                if entries[spec.name].providers[0].plugin != GENERIC_PLUGIN:
                    failures.append(_refuse_reserved_name(provider, spec.name))
                    continue
                del entries[spec.name]  # a plugin for the device replaces the generic one
            _add_entry(entries, spec, provider)
    _yield_to_device_plugins(entries)
    return Catalog(
        entries=entries, failures=tuple(failures), disabled=tuple(skipped), autoload=autoload
    )


def _yield_to_device_plugins(entries: dict[str, CatalogEntry]) -> None:
    """Keep auto-detection off the generic backend where a plugin declares its device."""
    for name, entry in entries.items():
        if entry.providers[0].plugin != GENERIC_PLUGIN:
            continue
        rivals = sorted(
            other.spec.name
            for other in entries.values()
            if other.providers[0].distribution != BUILTIN and other.spec.device_type == name
        )
        if rivals:
            entries[name] = replace(
                entry, specs=(replace(entry.spec, probe=_by_name_only(entry.spec, rivals)),)
            )


def _by_name_only(spec: BackendSpec, rivals: list[str]) -> Callable[[], Availability]:
    def probe() -> Availability:
        found = spec.probe()
        if not found.available:
            return found
        return Availability.by_name_only(
            f"the installed accel plugin backend {', '.join(map(repr, rivals))} drives "
            f"{spec.name!r} devices too, and auto-detection picks the plugin; name "
            f"{spec.name!r} to use accel's generic backend instead.",
            found.device_count,
        )

    return probe


def _is_builtin_name(entries: Mapping[str, CatalogEntry], name: str) -> bool:
    entry = entries.get(name)
    return entry is not None and entry.providers[0].distribution == BUILTIN


def _iter_entry_points() -> Iterator[tuple[metadata.EntryPoint, Provider]]:
    for entry_point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = entry_point.dist
        provider = Provider(
            plugin=entry_point.name,
            distribution=dist.name if dist is not None else "an unknown distribution",
            version=dist.version if dist is not None else "?",
        )
        yield entry_point, provider


def _plugin_key(provider: Provider) -> str:
    return f"{provider.distribution}:{provider.plugin}"


def _registered_as(providers: Mapping[str, Provider], provider: Provider) -> bool:
    # The same distribution can be visible twice (e.g. a lib64 -> lib symlink).
    return _plugin_key(provider) in providers


def _register_entry_point(
    manager: pluggy.PluginManager, entry_point: metadata.EntryPoint, provider: Provider
) -> None:
    plugin = entry_point.load()
    if manager.is_registered(plugin):
        raise ValueError(
            f"it points at {entry_point.value!r}, which another entry point already registered"
        )
    manager.register(plugin, name=_plugin_key(provider))
    if not any(impl.plugin is plugin for impl in manager.hook.accel_backends.get_hookimpls()):
        manager.unregister(plugin)
        raise TypeError(
            f"{entry_point.value!r} has no function named accel_backends marked with "
            "@accel.hookimpl"
        )


def _checked_specs(result: object) -> list[BackendSpec]:
    if not isinstance(result, Iterable) or isinstance(result, (str, bytes)):
        raise TypeError(
            f"accel_backends must return a list of accel.BackendSpec, got {type(result).__name__}"
        )
    specs = list(result)
    for item in specs:
        if not isinstance(item, BackendSpec):
            raise TypeError(
                "accel_backends must return a list of accel.BackendSpec, "
                f"but one item is a {type(item).__name__}"
            )
    return specs


def _add_entry(entries: dict[str, CatalogEntry], spec: BackendSpec, provider: Provider) -> None:
    existing = entries.get(spec.name)
    if existing is None:
        entries[spec.name] = CatalogEntry(specs=(spec,), providers=(provider,))
    else:
        entries[spec.name] = CatalogEntry(
            specs=(*existing.specs, spec), providers=(*existing.providers, provider)
        )


def _report_failure(provider: Provider, what_failed: str, exc: Exception) -> PluginFailure:
    error = f"{type(exc).__name__}: {exc}"
    problem = f"accel: backend plugin {provider.describe()} {what_failed} ({error})."
    if _env.flag("ACCEL_STRICT_PLUGINS"):
        raise PluginLoadError(_strict_message(problem, provider)) from exc
    warn(
        f"{problem} Its backends are skipped and the others keep working; fix or "
        f"uninstall it, or set ACCEL_DISABLED_PLUGINS={provider.plugin} to skip it "
        "silently.",
        PluginLoadWarning,
    )
    return PluginFailure(provider=provider, error=error)


def _refuse_reserved_name(provider: Provider, name: str) -> PluginFailure:
    error = f"it provides a backend named {name!r}, which is reserved for accel's built-in one"
    problem = f"accel: backend plugin {provider.describe()} is refused: {error}."
    if _env.flag("ACCEL_STRICT_PLUGINS"):
        raise PluginLoadError(_strict_message(problem, provider))
    warn(
        f"{problem} The built-in {name!r} is used and the plugin's other backends keep "
        "working; give the plugin's backend another name, or set "
        f"ACCEL_DISABLED_PLUGINS={provider.plugin} to skip the plugin silently.",
        PluginLoadWarning,
    )
    return PluginFailure(provider=provider, error=error)


def _strict_message(problem: str, provider: Provider) -> str:
    return (
        f"{problem} ACCEL_STRICT_PLUGINS is on, so no backend is loaded until this is "
        f"settled: fix or uninstall the plugin, set ACCEL_DISABLED_PLUGINS={provider.plugin} "
        "to skip it, or unset ACCEL_STRICT_PLUGINS to skip broken plugins with a warning."
    )
