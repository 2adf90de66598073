"""Double of ``habana_frameworks.torch``: importing it has the bridge's side effects.

See the package docstring: the torch-version assertion, ``TORCHINDUCTOR_COMPILE_THREADS``,
the imports of ``core``, ``distributed.hccl`` and ``hpu``, and the torch patches.
"""

from __future__ import annotations

import torch as _torch

from habana_frameworks import _double

_built_for = _double.BUILT_FOR_TORCH or ".".join(_torch.__version__.split(".")[:2])
_running = ".".join(_torch.__version__.split("+")[0].split(".")[:2])
assert _running == _built_for, (
    f"habana_frameworks (double) was built for torch {_built_for}, but torch "
    f"{_torch.__version__} is installed"
)

_double.record("torch.import")
_double.setenv("TORCHINDUCTOR_COMPILE_THREADS", "1")

from habana_frameworks.torch import core, hpu  # noqa: E402
from habana_frameworks.torch.core import torch_overwrites  # noqa: E402
from habana_frameworks.torch.distributed import hccl  # noqa: E402

torch_overwrites.apply()

__all__ = ["core", "hccl", "hpu"]
