"""The documentation's code blocks and markers, and the public names its API reference covers.

Shared by tests/test_docs.py and the torchrun test in tests/accel/integrations; tests are
imported in importlib mode, so tests/conftest.py loads it by path as ``docs_blocks``.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("accel", "backends", "checkpointing", "offload")
# Found by glob, so pages added later are tested without being listed anywhere.
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<lang>[^\s`]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
    flags=re.MULTILINE | re.DOTALL,
)
MARKER = re.compile(r"^[ \t]*<!-- docs-test: skip \((?P<reason>.*)\) -->[ \t]*$")
ANY_MARKER = re.compile(r"^\s*<!--\s*docs-test")


@dataclass(frozen=True)
class Block:
    """One fenced code block: its page, the line of its opening fence, language and code."""

    page: Path
    line: int
    lang: str
    code: str
    skip_reason: str | None

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, dedented, with the skip marker on the line before."""
    text = page.read_text()
    lines = text.splitlines()
    found = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = MARKER.match(lines[line - 2]) if line >= 2 else None
        indent = len(match.group("indent"))
        code = "".join(
            row[indent:] if row[:indent].isspace() else row
            for row in match.group("body").splitlines(keepends=True)
        )
        reason = before.group("reason") if before else None
        found.append(Block(page, line, match.group("lang"), code, reason))
    return found


def python_blocks() -> list[Block]:
    return [block for page in PAGES for block in blocks(page) if block.lang == "python"]


def missing_modules(code: str) -> list[str]:
    """Top-level modules a block imports that are not installed (optional extras)."""
    names = re.findall(r"^\s*(?:from|import) (\w+)", code, flags=re.MULTILINE)
    return sorted({name for name in names if importlib.util.find_spec(name) is None})


def prose(page: Path) -> str:
    """The page's text without code blocks and HTML comments, whitespace collapsed."""
    text = FENCE.sub(" ", page.read_text())
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.DOTALL)
    return " ".join(text.split())


def public_modules() -> dict[str, list[str]]:
    """Each public module that defines ``__all__``, with its names (read, not imported)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if any(part.startswith("_") for part in parts):
                continue
            for node in ast.parse(path.read_text()).body:
                targets = node.targets if isinstance(node, ast.Assign) else []
                if isinstance(node, ast.AnnAssign) and node.value is not None:
                    targets = [node.target]
                if any(
                    isinstance(target, ast.Name) and target.id == "__all__" for target in targets
                ):
                    assert isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None
                    found[".".join(parts)] = list(ast.literal_eval(node.value))
    return found
