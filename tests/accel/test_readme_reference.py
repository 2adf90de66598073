"""The README's reference parts match the code: protocol table, plugin guide, sections."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import accel
from accel._status import violation_message

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def _section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else None]


def test_protocol_table_names_every_member() -> None:
    table = [
        line for line in _section("The Accelerator protocol").splitlines() if line.startswith("|")
    ]
    cells = "\n".join(table)
    missing = [
        member
        for member in accel.protocol_members()
        if not re.search(rf"`{re.escape(member)}[`(]", cells)
    ]
    assert not missing, f"members missing from the README protocol table: {missing}"


def test_errors_name_readme_sections_that_exist() -> None:
    spec = accel.BackendSpec(
        name="npu", factory=object, probe=lambda: accel.Availability(available=True)
    )
    message = violation_message(spec, "a provider", object, ["name"])
    sections = re.findall(r"see '([^']+)' in the README", message)
    assert sections
    headings = set(re.findall(r"^#+ (.+)$", README, flags=re.MULTILINE))
    assert set(sections) <= headings, (sections, headings)


def test_plugin_guide_states_availability_fields_and_cpu_backend_constructor() -> None:
    from backends.cpu import CpuBackend

    guide = _section("Writing and certifying a backend plugin")
    fields = dataclasses.fields(accel.Availability)
    signature = ", ".join(
        field.name if field.default is dataclasses.MISSING else f"{field.name}={field.default!r}"
        for field in fields
    )
    assert f"`accel.Availability({signature})`" in guide
    assert not inspect.signature(CpuBackend).parameters
    assert "`backends.cpu.CpuBackend()` takes no arguments" in guide
    assert "need not equal the backend\nname" in guide
