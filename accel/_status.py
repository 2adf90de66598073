"""Whether a catalog entry can be used, found without creating it, and why not."""

from __future__ import annotations

from ._discovery import BUILTIN, Catalog, CatalogEntry
from ._protocol import iter_missing_members
from ._spec import Availability, BackendSpec

__all__ = [
    "class_violation",
    "conflict_availability",
    "probe",
    "status",
    "violation_message",
    "why_unknown",
]

#: The generic PrivateUse1 backend's name while no device has joined torch that way.
UNREGISTERED_DEVICE = "privateuse1"


def why_unknown(catalog: Catalog, name: str) -> str:
    """Say why ``name`` may be missing: plugins off, disabled or broken, else a typo."""
    if not catalog.autoload:
        return (
            "ACCEL_DISABLE_PLUGIN_AUTOLOAD is on, so only the built-in backends were "
            "loaded; unset it to load installed plugins."
        )
    for provider in catalog.disabled:
        if provider.plugin == name:
            return (
                f"Its plugin, {provider.describe()}, is installed but skipped because "
                "ACCEL_DISABLED_PLUGINS names it; remove it from there to use it."
            )
    for failure in catalog.failures:
        if failure.provider.plugin == name:
            return (
                f"Its plugin, {failure.provider.describe()}, is installed but failed to "
                f"load ({failure.error}); fix or reinstall it."
            )
    hints = []
    generic = catalog.entries.get(UNREGISTERED_DEVICE)
    if generic is not None:
        reason = probe(generic).reason
        if reason:
            hints.append(f"If {name!r} is a device that joins torch through PrivateUse1: {reason}")
    if catalog.failures:
        broken = "; ".join(f"{f.provider.describe()} ({f.error})" for f in catalog.failures)
        hints.append(f"These plugins failed to load and may provide it: {broken}.")
    if catalog.disabled:
        skipped = ", ".join(p.plugin for p in catalog.disabled)
        hints.append(f"ACCEL_DISABLED_PLUGINS skips these installed plugins: {skipped}.")
    hints.append("Check the spelling, or pip-install the plugin that provides it.")
    return " ".join(hints)


def status(entry: CatalogEntry) -> Availability:
    """What listing and auto-detection show: a conflict, a class lacking members, the probe."""
    conflict = conflict_availability(entry)
    if conflict is not None:
        return conflict
    violation = class_violation(entry)
    if violation is not None:
        return Availability.unavailable(violation)
    return probe(entry)


def class_violation(entry: CatalogEntry) -> str | None:
    """Check a factory that is a class without calling it; ``None`` when it looks complete.

    Members must be defined on the class or declared as class annotations (attributes
    set in ``__init__``). A class with ``__getattr__`` is only checked once created.
    """
    factory = entry.spec.factory
    if not isinstance(factory, type) or hasattr(factory, "__getattr__"):
        return None
    declared = {
        name for klass in factory.__mro__ for name in vars(klass).get("__annotations__", {})
    }
    missing = [member for member in iter_missing_members(factory) if member not in declared]
    if not missing:
        return None
    return violation_message(entry.spec, entry.providers[0].describe(), factory, missing)


def conflict_availability(entry: CatalogEntry) -> Availability | None:
    if not entry.is_conflicted:
        return None
    providers = " and ".join(p.describe() for p in entry.providers)
    plugins = sorted(p.plugin for p in entry.providers if p.distribution != BUILTIN)
    return Availability.unavailable(
        f"Backend {entry.spec.name!r} is provided twice: by {providers}. "
        "Uninstall one of them, or skip one by setting ACCEL_DISABLED_PLUGINS to "
        f"one of: {', '.join(plugins)}."
    )


def probe(entry: CatalogEntry, *, named: bool = False) -> Availability:
    """Run the entry's probe: its ``named_probe`` when the user named it, if it has one."""
    check = entry.spec.named_probe if named and entry.spec.named_probe else entry.spec.probe
    try:
        result: object = check()
    except Exception as exc:
        return Availability.unavailable(
            f"its availability check raised {type(exc).__name__}: {exc}."
        )
    if not isinstance(result, Availability):
        return Availability.unavailable(
            f"its availability check returned {type(result).__name__}, not accel.Availability."
        )
    return result


def violation_message(spec: BackendSpec, provider: str, kind: type, missing: list[str]) -> str:
    return (
        f"Backend {spec.name!r} from {provider} does not implement accel.Accelerator: "
        f"its object ({kind.__name__}) lacks {', '.join(missing)}. Add those members "
        "(see 'Writing and certifying a backend plugin' in accel's documentation, "
        "docs/plugins.md), or uninstall the plugin."
    )
