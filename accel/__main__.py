"""Entry point of ``python -m accel`` and the ``accel`` console script."""

from __future__ import annotations

import sys

from ._cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
