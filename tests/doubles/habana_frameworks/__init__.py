"""A test double of Intel Gaudi's PyTorch bridge (``habana_frameworks``).

This is NOT Habana's code. It is a small stand-in, written for accel's test suite, that
has the module paths and function names ``backends/hpu.py`` imports from the real bridge
(``habana-torch-plugin``), so the ``hpu`` backend can be tested on machines without a
Gaudi card. It runs nothing on any device and patches nothing in torch.

What it provides:

* ``habana_frameworks.torch.core.mark_step``
* ``habana_frameworks.torch.hpu``: availability, device count, synchronize, ``Stream``,
  ``Event``, ``stream()``, ``current_stream()`` and memory statistics
* ``habana_frameworks.torch.hpu.random``: a generator backed by a private CPU
  ``torch.Generator``, so its states are real ``uint8`` tensors; like the real bridge it
  accepts device 0 only
* ``habana_frameworks.torch.utils.internal.is_lazy`` (reads ``PT_HPU_LAZY_MODE``,
  default eager as in newer bridges) and ``utils.experimental._is_fp16_supported``
* ``habana_frameworks.torch.distributed.hccl`` (importing it is recorded)

Every call is appended to :data:`habana_frameworks._double.CALLS` as ``(name, args)``,
with ``name`` relative to ``habana_frameworks.torch`` (e.g. ``"core.mark_step"``);
:mod:`habana_frameworks._double` also holds the knobs tests turn (device count, fp16
support, memory figures) and :func:`habana_frameworks._double.reset`.

Put ``tests/doubles`` on ``sys.path`` to use it; ``tests/doubles/habana_double.py`` does
that and points ``backends.hpu.DEVICE_NODE_GLOBS`` at fake device nodes.
"""
