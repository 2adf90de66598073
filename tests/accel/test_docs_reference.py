"""The documentation's reference parts match the code: protocol table, plugin guide, pages."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import accel
from accel._status import violation_message

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _page(name: str) -> str:
    return (DOCS / name).read_text()


def test_protocol_table_names_every_member() -> None:
    table = [line for line in _page("protocol.md").splitlines() if line.startswith("|")]
    cells = "\n".join(table)
    missing = [
        member
        for member in accel.protocol_members()
        if not re.search(rf"`{re.escape(member)}[`(]", cells)
    ]
    assert not missing, f"members missing from the protocol table in docs/protocol.md: {missing}"


def test_errors_name_documentation_pages_that_exist() -> None:
    spec = accel.BackendSpec(
        name="npu", factory=object, probe=lambda: accel.Availability(available=True)
    )
    message = violation_message(spec, "a provider", object, ["name"])
    pages = re.findall(r"see '([^']+)' in accel's documentation, (docs/[\w./-]+\.md)", message)
    assert pages
    for title, path in pages:
        assert _page(path.removeprefix("docs/")).startswith(f"# {title}\n"), (title, path)


def test_plugin_guide_states_availability_fields_and_cpu_backend_constructor() -> None:
    from backends.cpu import CpuBackend

    guide = _page("plugins.md")
    fields = dataclasses.fields(accel.Availability)
    signature = ", ".join(
        field.name if field.default is dataclasses.MISSING else f"{field.name}={field.default!r}"
        for field in fields
    )
    assert f"`accel.Availability({signature})`" in guide
    assert not inspect.signature(CpuBackend).parameters
    assert "`backends.cpu.CpuBackend()` takes no arguments" in guide
    assert "need not equal the backend\nname" in guide
