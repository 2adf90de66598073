"""``offload_parameters``: any model's parameters in host memory, loaded per module.

:mod:`.offload_parameters` is the entry point; :mod:`.handle` the handle, its
:class:`~.handle.Strategy` protocol and the registry; :mod:`.swap` (with :mod:`.units`
and :mod:`.saved`) and :mod:`.copied` the two strategies; :mod:`.hooks` the hooks both
install.
"""
