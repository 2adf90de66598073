"""Which of the two strategies a device takes: swap ``.data``, or copy through autograd.

Both wrappers (:class:`offload.OffloadModel`, :func:`offload.offload_parameters`) keep
parameters in host memory and bring them to the device while they compute, in one of two
ways, named the same in both:

* ``"swap-data"``: each parameter's ``.data`` points at device memory while it computes
  and back at its packed host memory afterwards. Where the device is the host itself
  (nothing moves) this is the strategy too, with every copy skipped.
* ``"copy-parameters"``: the parameters stay host tensors and reach the device as
  differentiable copies (:mod:`offload._core.copies`), for a device whose tensors cannot
  take a host tensor's place (a lazy-tensor runtime's, a PrivateUse1 device's).

:func:`choose` decides, once per wrapper; each wrapper maps the name to its own class.
"""

from __future__ import annotations

from typing import Literal

import torch

from . import copies, transfer

__all__ = ["COPY_PARAMETERS", "SWAP_DATA", "StrategyName", "choose"]

StrategyName = Literal["swap-data", "copy-parameters"]
SWAP_DATA: StrategyName = "swap-data"
COPY_PARAMETERS: StrategyName = "copy-parameters"
_HOST = torch.device("cpu")


def choose(device: torch.device, home: torch.device = _HOST) -> StrategyName:
    """Return the strategy for computing on ``device`` with parameters kept on ``home``.

    ``"copy-parameters"`` where tensors must move and torch refuses to point a host
    tensor's ``.data`` at ``device`` (see :func:`offload._core.copies.swaps_data`),
    ``"swap-data"`` everywhere else.
    """
    if transfer.copies_needed(device, home) and not copies.swaps_data(device):
        return COPY_PARAMETERS
    return SWAP_DATA
