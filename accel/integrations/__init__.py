"""Adapters that run training frameworks on any accel backend.

* :mod:`accel.integrations.lightning`: the accelerators, strategies and precision
  plugins of Lightning's Trainer and of Lightning Fabric, filled from the
  :class:`accel.Accelerator` protocol (``pip install 'accel-hal[lightning]'``).
* :mod:`accel.integrations.deepspeed`: a complete ``DeepSpeedAccelerator`` answering from
  the protocol, and :func:`accel.integrations.deepspeed.install` (``pip install
  'accel-hal[deepspeed]'``).

Each submodule imports its framework when it is imported; ``import accel`` and this
package import neither.
"""

from __future__ import annotations

__all__: list[str] = []
