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


def _register_compile_backend() -> None:
    # The real bridge registers its torch.compile backend, "hpu_backend", on import; the
    # double registers one that runs the captured graph as it is.
    import torch._dynamo

    if "hpu_backend" in torch._dynamo.list_backends(exclude_tags=()):
        return

    def hpu_backend(graph_module: object, example_inputs: object) -> object:
        return graph_module.forward  # type: ignore[attr-defined]

    torch._dynamo.register_backend(name="hpu_backend")(hpu_backend)


_register_compile_backend()

__all__ = ["core", "hccl", "hpu"]
