"""Double of ``habana_frameworks.torch.distributed.hccl``.

The real module registers the ``hccl`` backend of ``torch.distributed`` on import; the
double records the import as ``"hccl.import"`` and registers nothing.
"""

from __future__ import annotations

from habana_frameworks import _double

_double.record("hccl.import")
