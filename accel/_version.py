"""accel's version: the one place it is written.

``pyproject.toml`` reads it (``[tool.setuptools.dynamic]``), so the built wheel, ``accel
--version`` and :data:`accel.__version__` always agree. Bump it, and move the changelog's
"Unreleased" entries under it, when you cut a release (see "Releasing" in docs/development.md).
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
