"""Calibration: the cost model's rates measured on the device, on request only.

Planning never runs anything here: it prices a profile at given rates (``.._cost``).
:func:`calibrate_rates` runs when a user calls it, and ``save=True`` writes its rates to
the host's cache, which planning then reads (``.._default_rates``). Its modules:
``_calibrate`` (the rates of products, convolutions, attention, memory, random draws and
an operator call, and of a reference step's operators), ``_operator_rates`` (byte rates
of a model's own operators, recorded on fake tensors and timed at their shapes),
``_overheads`` (a selective policy's and a saved-tensor hook's cost) and
``_stopwatch``, the one module of the planner that reads a clock (also read by
:meth:`CheckpointPlan.measure` with ``timed=True``).
"""

from __future__ import annotations

from ._calibrate import calibrate_rates

__all__ = ["calibrate_rates"]
