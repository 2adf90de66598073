"""MkDocs hooks: serve pictures that live outside docs/ without copying them in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
# Site path -> repository file. The benchmark writes its plot under benchmarks/results/;
# the site shows that file, so a new run needs no second copy.
PICTURES = {"images/budget-cpu.png": ROOT / "benchmarks" / "results" / "budget-cpu.png"}


def on_files(files: Files, config: Any) -> Files:
    """Add each picture in PICTURES to the site's files."""
    for site_path, source in PICTURES.items():
        files.append(File.generated(config, site_path, abs_src_path=str(source)))
    return files
