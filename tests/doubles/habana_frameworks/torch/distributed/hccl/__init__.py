"""Double of ``habana_frameworks.torch.distributed.hccl``.

Like the real module, importing it registers ``hccl`` as a ``torch.distributed`` backend
for ``hpu`` devices (a process-wide registration that torch offers no way to undo), and
the import is recorded as ``"hccl.import"``. The double cannot create process groups:
``init_process_group("hccl")`` raises ``RuntimeError``.
"""

from __future__ import annotations

from typing import Any, NoReturn

import torch.distributed as dist

from habana_frameworks import _double

__all__: list[str] = []


def _create_process_group(*args: Any, **kwargs: Any) -> NoReturn:
    raise RuntimeError("the habana_frameworks test double cannot create hccl process groups")


_double.record("hccl.import")
if dist.is_available() and "hccl" not in dist.Backend.backend_list:
    dist.Backend.register_backend("hccl", _create_process_group, devices=["hpu"])
