"""The README's Python examples run as written."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_readme_has_examples() -> None:
    assert len(BLOCKS) >= 4


def _missing_modules(block: str) -> list[str]:
    """Top-level modules a block imports that are not installed (optional extras)."""
    names = re.findall(r"^(?:from|import) (\w+)", block, flags=re.MULTILINE)
    return sorted({name for name in names if importlib.util.find_spec(name) is None})


@pytest.mark.parametrize("index", range(len(BLOCKS)))
# Lightning 2.6's own _pytree module uses LeafSpec, which torch 2.10 and later deprecate.
@pytest.mark.filterwarnings(r"ignore:.*isinstance\(treespec, LeafSpec\):FutureWarning")
def test_example_runs(index: int) -> None:
    missing = _missing_modules(BLOCKS[index])
    if missing:
        pytest.skip(f"the example needs {', '.join(missing)} (an optional extra), not installed")
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
