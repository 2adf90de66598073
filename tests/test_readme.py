"""The README's Python examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_readme_has_examples() -> None:
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_example_runs(index: int) -> None:
    exec(compile(BLOCKS[index], f"README.md python block {index}", "exec"), {})


def test_readme_opens_with_the_two_commands() -> None:
    first_block = re.search(r"```bash\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert first_block is not None
    assert first_block.group(1).splitlines() == [
        "python -m pip install -e . && python -m accel demo",
        "python -m pip install -e '.[test]' && python -m pytest",
    ]


def test_ci_runs_the_readme_test_command() -> None:
    ci = (README.parent / ".ci" / "run").read_text()
    assert "python -m pip install -e '.[test]' && python -m pytest\n" in ci
