"""Check that the built site's API inventory holds every public name.

Usage: ``python .ci/check_docs_inventory.py SITE_DIR`` after ``mkdocs build``. Every name
in the ``__all__`` of a public module of accel, backends, checkpointing and offload must
be an object in ``SITE_DIR/objects.inv`` (what mkdocstrings rendered), so a name that a
directive would cover but the renderer left out (a filter, a failed alias) fails CI.
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import docs_blocks  # noqa: E402  (tests/docs_blocks.py: the public modules, read statically)


def inventory(site: Path) -> set[str]:
    """The object names in a Sphinx-format (version 2) objects.inv."""
    raw = (site / "objects.inv").read_bytes()
    header, _, body = raw.partition(b"# The remainder of this file is compressed using zlib.\n")
    if not header.startswith(b"# Sphinx inventory version 2"):
        raise SystemExit(f"{site / 'objects.inv'} is not a version 2 inventory.")
    return {line.split(" ", 1)[0] for line in zlib.decompress(body).decode().splitlines()}


def main() -> int:
    """Compare the inventory of ``sys.argv[1]`` with the public names; return the status."""
    if len(sys.argv) != 2:
        raise SystemExit("usage: python .ci/check_docs_inventory.py SITE_DIR")
    names = inventory(Path(sys.argv[1]))
    modules = docs_blocks.public_modules()
    expected = [f"{module}.{name}" for module, exported in modules.items() for name in exported]
    missing = [name for name in expected if name not in names]
    if missing:
        print(f"not in the API reference ({len(missing)}): {', '.join(missing)}")
        return 1
    print(f"the API reference documents all {len(expected)} public names of {len(modules)} modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
