"""The rates planning takes by default: this host's cache of calibrated rates, else built-in.

:func:`checkpointing.calibrate_rates` with ``save=True`` writes its rates to a file per
device (:func:`rates_cache_path`); :func:`default_rates` reads that file back, and
:func:`host_rates` also says, for the plan's note, which file it read. Two machines, or
two users of one machine, plan alike unless one of them holds such a cache: the note is
where a plan says so. A file that does not read back (damaged, for another device type,
or of a format this release does not read) is refused with a warning naming its format,
and the built-in rates (:func:`._cost.builtin_rates`) are taken as without one.

The file is :meth:`DeviceRates.to_dict` with ``"format"``: :data:`RATES_FORMAT`. Files
written before the format was recorded hold the same fields without ``"format"``: they
are read as of this format.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import torch

from accel import Accelerator

from ._cost import DeviceRates
from ._tables import builtin_rates, cpu_table_note, host_processor

__all__ = [
    "RATES_FORMAT",
    "default_rates",
    "device_name",
    "host_rates",
    "rates_cache_path",
    "save_rates",
]

#: The layout of the rate cache this release writes and reads, with its version.
RATES_FORMAT = "accel.device-rates/1"


class _Refused(Exception):
    """Why a cache file's rates are not used (a phrase for the warning and the note)."""


def rates_cache_path(backend: Accelerator) -> Path:
    """Where calibrated rates for ``backend``'s device are cached.

    ``$ACCEL_CACHE_DIR`` (default ``~/.cache/accel``), then
    ``rates-<device type>-<device name>-torch<version>.json``.

    Args:
        backend: The backend whose device the rates describe.

    Returns:
        The cache file's path (it need not exist).
    """
    root = Path(os.environ.get("ACCEL_CACHE_DIR") or Path.home() / ".cache" / "accel")
    name = "".join(c if c.isalnum() else " " for c in device_name(backend))
    name = "-".join(name.split())
    version = torch.__version__.split("+")[0]
    return root / f"rates-{backend.device_type}-{name}-torch{version}.json"


def device_name(backend: Accelerator) -> str:
    """The device's model name (a host's processor and its intra-op threads), else the backend's."""
    if backend.device_type == "cpu":
        return f"{host_processor().name}, {torch.get_num_threads()} threads"
    module = getattr(torch, backend.device_type, None)
    try:
        return str(module.get_device_name())  # type: ignore[union-attr]
    except Exception:  # a device module without names: the backend's
        return backend.name


def save_rates(rates: DeviceRates, backend: Accelerator) -> Path:
    """Write ``rates`` to ``backend``'s cache file, in :data:`RATES_FORMAT`; return its path."""
    path = rates_cache_path(backend)
    path.parent.mkdir(parents=True, exist_ok=True)
    values = {"format": RATES_FORMAT, **rates.to_dict()}
    path.write_text(json.dumps(values, indent=1) + "\n", encoding="utf-8")
    return path


def default_rates(backend: Accelerator) -> DeviceRates:
    """The rates the planner takes by default: cached for this device, else built-in.

    A cache file that exists but does not read back (damaged, for another device type,
    or of a format this release does not read) is refused with a warning that names
    its format and what to do; the built-in rates are taken instead.

    Args:
        backend: The backend the model runs on.

    Returns:
        The rates :func:`checkpointing.calibrate_rates` cached for this device
        (:func:`rates_cache_path`), where a cache file exists and reads back, else
        :func:`checkpointing.builtin_rates` for its device type.
    """
    return host_rates(backend)[0]


def host_rates(backend: Accelerator) -> tuple[DeviceRates, str]:
    """:func:`default_rates`, and the plan's note on them.

    The note names the cache file read and its rates' source (``"calibrated on ..."``),
    or the file refused and why. For the built-in rates it is empty, but on a host
    whose processor no built-in CPU table was measured on
    (:func:`._tables.cpu_table_note`).
    """
    path = rates_cache_path(backend)
    builtin = builtin_rates(backend.device_type)
    if not path.is_file():
        return builtin, cpu_table_note() if backend.device_type == "cpu" else ""
    try:
        rates = _read(path, backend.device_type)
    except _Refused as refused:
        warnings.warn(
            f"checkpointing: the cached device rates in {path} were not used: {refused}. "
            "The built-in rates are used instead. Calibrate again with "
            "checkpointing.calibrate_rates(save=True), which rewrites the file for this "
            "release, or delete the file.",
            UserWarning,
            stacklevel=3,
        )
        return (
            builtin,
            f"Built-in rates: this host's cached rates in {path} were refused: {refused}.",
        )
    return rates, f"Rates from this host's cache {path}: {rates.source}."


def _read(path: Path, device_type: str) -> DeviceRates:
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:  # unreadable, not UTF-8, not JSON
        raise _Refused(f"it does not read as JSON ({type(error).__name__})") from None
    if not isinstance(values, dict):
        raise _Refused(f"it holds a JSON {type(values).__name__}, not an object of rates")
    found = values.pop("format", RATES_FORMAT)  # written before formats were recorded
    if found != RATES_FORMAT:
        raise _Refused(
            f"it is of format {found!r}, and this release reads {RATES_FORMAT!r} or a file "
            "without a format, written before formats were recorded"
        )
    if values.get("device_type") != device_type:
        raise _Refused(
            f"its rates are for the device type {values.get('device_type')!r}, not {device_type!r}"
        )
    try:
        return DeviceRates.from_dict(values)
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        reason = str(error).removeprefix("checkpointing: ").split(". ")[0].rstrip(".")
        raise _Refused(f"its rates do not read back ({reason})") from None
