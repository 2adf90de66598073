"""A test double of Intel Gaudi's PyTorch bridge (``habana_frameworks``).

This is NOT Habana's code. It is a stand-in, written for accel's test suite, with the
module paths and function names ``backends/hpu.py`` uses, and the bridge's behaviour that
accel must cope with (read from the bridge's public source; see the project's research
notes), so the ``hpu`` backend can be tested on machines without a Gaudi card. It runs
nothing on a device.

What importing ``habana_frameworks.torch`` does, as in the bridge:

* asserts that torch's major.minor is the one the bridge was built for
  (``_double.BUILT_FOR_TORCH``; ``None`` means the running torch);
* writes ``TORCHINDUCTOR_COMPILE_THREADS=1``;
* imports ``core``, ``distributed.hccl`` (registers ``hccl``; sets ``HLS_MODULE_ID``
  from ``LOCAL_RANK``/``HABANA_VISIBLE_MODULES``, ``ID`` from ``RANK``, the torchrun
  variables from Open MPI's, and ``MASTER_ADDR``/``MASTER_PORT`` defaults) and ``hpu``;
* patches torch (``torch/core/torch_overwrites.py``): ``torch.manual_seed`` (also seeds the
  hpu generator), ``torch.seed``, ``torch.random.fork_rng`` (default device "hpu"),
  ``Tensor.record_stream``, ``torch.save``/``torch.load``, ``Module.__setattr__``/
  ``add_module``, ``torch.distributed.init_process_group``/``new_group``; each wrapper
  records its call as ``"patched.<name>"`` and delegates to the original;
* registers ``torch.hpu`` (the device module).

Behaviour modelled elsewhere: the lazy-mode default of the release, cached on the first
read (``utils.internal.is_lazy``); ``core.mark_step`` does nothing in eager mode;
``hpu.current_stream()`` returns a new object per call in eager mode (cached in lazy
mode; streams compare equal by identity of the underlying stream); ``hpu.init()``, memory
statistics and streams acquire the card (recorded once as ``"device.acquire"``); device
strings that are not hpu devices raise ``ValueError``; ``random.manual_seed`` returns the
generator; ``random.set_rng_ctx("philox")`` makes ``get_rng_state`` return the shared
live state tensor. ``habana_frameworks.autoload`` is the ``torch.backends`` entry point
(``tests/doubles/autoload_site`` holds the distribution metadata that registers it).

Every call is appended to :data:`habana_frameworks._double.CALLS` as ``(name, args)``,
with ``name`` relative to ``habana_frameworks.torch`` (e.g. ``"core.mark_step"``);
:mod:`habana_frameworks._double` also holds the knobs, :func:`~habana_frameworks._double.reset`
and :func:`~habana_frameworks._double.undo_process_changes`.

Put ``tests/doubles`` on ``sys.path`` to use it; ``tests/doubles/habana_double.py`` does
that and builds a fake ``/dev`` and ``/sys`` tree with Gaudi nodes for the probe.
"""
