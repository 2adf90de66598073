"""The package's shape: no vendor names, a sorted public API with docstrings, torch's signature."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import torch.utils.checkpoint

import checkpointing

PACKAGE = Path(checkpointing.__file__).resolve().parent
VENDOR = re.compile(r"(?<![a-z])(cuda|hpu|habana|htcore|xpu|mps|xla)(?![a-z])", re.IGNORECASE)


def test_no_file_names_a_vendor() -> None:
    files = sorted(PACKAGE.rglob("*"))
    assert any(path.name == "_non_reentrant.py" for path in files)
    hits = [
        f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}"
        for path in files
        if path.is_file() and path.suffix in {".py", ".pyi", ".typed", ".md", ".txt"}
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if VENDOR.search(line)
    ]
    assert hits == []


def test_vendor_pattern_catches_names() -> None:
    words = ("torch.cuda", "HPU", "habana_frameworks", "XPU", "torch_xla", "XLA", "mps")
    assert all(VENDOR.search(word) for word in words)
    assert not any(VENDOR.search(word) for word in ("json.dumps", "bumps"))


def test_public_api_is_sorted_and_documented() -> None:
    assert checkpointing.__all__ == sorted(checkpointing.__all__)
    assert checkpointing.__doc__
    for name in checkpointing.__all__:
        obj = getattr(checkpointing, name)
        assert inspect.getdoc(obj), f"{name} has no docstring"


def test_checkpoint_accepts_torchs_parameters() -> None:
    ours = inspect.signature(checkpointing.checkpoint).parameters
    theirs = inspect.signature(torch.utils.checkpoint.checkpoint).parameters
    assert set(theirs) <= set(ours), set(theirs) - set(ours)
    ours_seq = inspect.signature(checkpointing.checkpoint_sequential).parameters
    theirs_seq = inspect.signature(torch.utils.checkpoint.checkpoint_sequential).parameters
    assert list(ours_seq) == list(theirs_seq)


def _name(path: Path) -> str:
    """``planner/_profile.py`` -> ``planner._profile``; a package's ``__init__`` by its name."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """The package's modules ``path`` imports (``from ._x import ...``), in functions too."""
    import ast

    here = _name(path).split(".")[:-1] if path.name != "__init__.py" else _name(path).split(".")
    here = [part for part in here if part]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level >= 1:
            base = here[: len(here) - (node.level - 1)]
            if node.module:
                found.add(".".join([*base, node.module]))
            else:
                found.update(".".join([*base, alias.name]) for alias in node.names)
    return found


def test_modules_import_each_other_without_a_circle() -> None:
    graph = {_name(path): _imports(path) for path in PACKAGE.rglob("*.py") if _name(path)}
    assert "planner" in graph["_apply"] and "_wrapper" in graph["_apply"]  # the entry point
    assert "planner._planning" in graph["planner"]
    # The planner uses the checkpoint's modules; they never use the planner.
    core = [name for name in graph if not name.startswith("planner") and name != "_apply"]
    assert not [name for name in core if any(i.startswith("planner") for i in graph[name])]
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import circle: {' -> '.join((*path, module))}"
        if module in done:
            return
        for imported in graph.get(module, set()):
            visit(imported, (*path, module))
        done.add(module)

    for module in graph:
        visit(module, ())
