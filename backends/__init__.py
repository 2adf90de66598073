"""Built-in accel backends: ``cpu``, ``cuda``, ``hpu``, ``xpu`` and ``mps``.

Each module is a pluggy plugin implementing ``accel_backends``, the same hook
third-party backends implement. Nothing here imports a vendor library at import
time; each backend's factory does, when that backend is selected.
"""
