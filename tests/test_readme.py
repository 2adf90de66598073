"""The README is a front page: the two commands first, links that resolve, CI in step.

Its Python blocks run with the documentation's, in tests/test_docs.py.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_opens_with_the_two_commands() -> None:
    first_block = re.search(r"```bash\n(.*?)```", README, flags=re.DOTALL)
    assert first_block is not None
    assert first_block.group(1).splitlines() == [
        "python -m pip install -e . && python -m accel demo",
        "python -m pip install -e '.[test]' && python -m pytest",
    ]
    assert README.index("```bash") < README.index("```python")


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python -m pip install -e '.[test]' && python -m pytest\n" in ci


def test_readme_links_resolve_to_files_and_headings() -> None:
    links = re.findall(r"\]\(([^)\s]+)\)", README)
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert any(link.startswith("docs/") for link in local)
    for link in local:
        path, _, anchor = link.partition("#")
        target = ROOT / path if path else ROOT / "README.md"
        assert target.is_file(), f"README links to {link}, which is not a file"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", target.read_text(), flags=re.MULTILINE)
            slugs = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}
            assert anchor in slugs, f"README links to {link}: no such heading"


def test_readme_tour_links_every_guide() -> None:
    guides = sorted(
        page.name
        for page in (ROOT / "docs").glob("*.md")
        if page.name not in {"index.md", "changelog.md"}
    )
    unlinked = [name for name in guides if f"(docs/{name}" not in README]
    assert not unlinked, f"guides the README's table does not link: {unlinked}"


def test_development_section_builds_and_serves_the_docs() -> None:
    development = README.split("\n## Development\n", 1)[1]
    assert "python -m pip install -e '.[docs]'" in development
    assert "mkdocs build --strict" in development
    assert "mkdocs serve" in development
    assert "(docs/development.md)" in development
