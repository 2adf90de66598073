"""The documentation is tested: its Python runs, its skips are explained, its API is complete.

Every ```python block in README.md and docs/**/*.md runs alone, in a fresh namespace. A
block that cannot run here is written right after ``<!-- docs-test: skip (needs ...) -->``
and its page says what it needs; blocks importing an optional module that is not
installed skip. The site itself is built by CI (``mkdocs build --strict``), which also
checks the built API inventory (.ci/check_docs_inventory.py).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

docs_blocks = sys.modules["docs_blocks"]
ROOT = docs_blocks.ROOT
DOCS = ROOT / "docs"
BLOCKS = docs_blocks.python_blocks()


def test_blocks_are_found_on_every_page_that_has_them() -> None:
    pages = {block.page for block in BLOCKS}
    assert ROOT / "README.md" in pages
    assert {DOCS / "getting-started.md", DOCS / "offload.md", DOCS / "plugins.md"} <= pages
    assert len(BLOCKS) >= 15


@pytest.mark.parametrize("block", BLOCKS, ids=[block.name for block in BLOCKS])
# Lightning 2.6's own _pytree module uses LeafSpec, which torch 2.10 and later deprecate.
@pytest.mark.filterwarnings(r"ignore:.*isinstance\(treespec, LeafSpec\):FutureWarning")
# torch.compile's guards on Python 3.13.0 exactly (a CPython bug fixed in 3.13.1); the
# compiled examples of the docs run on CI's newest cell.
@pytest.mark.filterwarnings("ignore:Guards may run slower on Python 3.13.0:RuntimeWarning")
def test_python_block_runs(block: docs_blocks.Block) -> None:
    if block.skip_reason is not None:
        pytest.skip(f"{block.name}: {block.skip_reason}")
    missing = docs_blocks.missing_modules(block.code)
    if missing:
        pytest.skip(f"{block.name} needs {', '.join(missing)} (an optional extra), not installed")
    exec(compile(block.code, block.name, "exec"), {})


def test_every_skip_marker_is_right_before_a_python_block() -> None:
    misplaced = []
    for page in docs_blocks.PAGES:
        lines = page.read_text().splitlines()
        for number, line in enumerate(lines, start=1):
            if not docs_blocks.ANY_MARKER.search(line):
                continue
            following = lines[number] if number < len(lines) else ""
            if not docs_blocks.MARKER.match(line) or following.strip() != "```python":
                misplaced.append(f"{page.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not misplaced, (
        "each `<!-- docs-test: skip (needs ...) -->` line must be the line right before a "
        f"```python fence: {misplaced}"
    )


SKIPPED = [block for block in BLOCKS if block.skip_reason is not None]


@pytest.mark.parametrize("block", SKIPPED, ids=[block.name for block in SKIPPED])
def test_a_skipped_block_says_what_it_needs_on_its_page(block: docs_blocks.Block) -> None:
    reason = block.skip_reason
    assert reason.startswith("needs "), f"{block.name}: a skip reason starts with 'needs '"
    need = " ".join(reason.removeprefix("needs ").split()).lower()
    assert need in docs_blocks.prose(block.page).lower(), (
        f"{block.name} is skipped because it needs {need!r}, but its page's text does not "
        "say so: write that it needs it, in those words, where a reader will see it."
    )


def test_the_marker_skips_and_a_missing_module_skips(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Two GPUs are needed.\n\n<!-- docs-test: skip (needs two GPUs) -->\n```python\n"
        "raise SystemExit\n```\n\n```python\nimport not_a_module_anyone_installed\n```\n"
        "\n- a list\n\n    ```python\n    x = 1\n    ```\n"
    )
    marked, optional, indented = docs_blocks.blocks(page)
    assert marked.skip_reason == "needs two GPUs" and marked.line == 4
    assert optional.skip_reason is None
    assert docs_blocks.missing_modules(optional.code) == ["not_a_module_anyone_installed"]
    assert indented.code == "x = 1\n"
    assert "needs two gpus" not in docs_blocks.prose(page).lower()  # the comment is not prose
    assert "two gpus" in docs_blocks.prose(page).lower()


def test_python_code_is_fenced_as_python() -> None:
    # ```py, ```python3 or ```pycon would escape the runner above.
    others = [
        block.name
        for page in docs_blocks.PAGES
        for block in docs_blocks.blocks(page)
        if block.lang.lower() in {"py", "py3", "python3", "pycon", "ipython"}
    ]
    assert not others, f"fence Python examples as ```python so that they run: {others}"


def _directives() -> dict[str, str]:
    """``::: identifier`` -> its options block, over every API reference page."""
    directives = {}
    for page in sorted((DOCS / "api").rglob("*.md")):
        text = page.read_text()
        for match in re.finditer(r"^::: *(\S+)\n((?:[ \t]+.*\n|\n)*)", text, flags=re.MULTILINE):
            directives[match.group(1)] = match.group(2)
    return directives


def test_every_public_name_is_in_the_api_reference() -> None:
    modules = docs_blocks.public_modules()
    assert {"accel", "accel.testing", "checkpointing", "offload", "backends.cpu"} <= set(modules)
    assert {"accel.integrations.lightning", "accel.integrations.deepspeed"} <= set(modules)
    config = (ROOT / "mkdocs.yml").read_text()
    # A module directive renders what __all__ exports ("public") unless it lists members.
    assert re.search(r"^ +filters: public$", config, flags=re.MULTILINE)
    directives = _directives()
    whole = {name for name, options in directives.items() if "members:" not in options}
    missing = [
        f"{module}.{name}"
        for module, names in modules.items()
        for name in names
        if module not in whole and f"{module}.{name}" not in directives
    ]
    assert not missing, f"public names with no `:::` directive under docs/api/: {missing}"


def test_api_directives_name_public_modules_and_names() -> None:
    modules = docs_blocks.public_modules()
    for identifier in _directives():
        module, _, name = identifier.rpartition(".")
        is_module = identifier in modules or identifier == "backends"
        assert is_module or name in modules.get(module, []), (
            f"`::: {identifier}` names neither a public module nor a name in its __all__"
        )


def test_every_page_opens_with_its_title() -> None:
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text()
        include = re.match(r'--8<-- "([^"]+)"', text)
        if include:  # a page that is another file (the changelog)
            text = (ROOT / include.group(1)).read_text()
        assert text.startswith("# "), f"{page.relative_to(ROOT)} does not start with an H1"


def test_ci_builds_the_site_strictly_and_checks_the_inventory() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python -m pip install -e '.[docs]'" in ci
    assert re.search(r"mkdocs build --strict --site-dir \S+", ci)
    assert "python .ci/check_docs_inventory.py" in ci
