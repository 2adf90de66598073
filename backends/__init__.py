"""Built-in accel backends, each a pluggy plugin.

``cpu``, ``cuda``, ``hpu``, ``xpu``, ``mps``, ``xla``, ``recording``, and one named after
the device torch has registered through PrivateUse1 (``privateuse1`` while there is none).

Each module implements ``accel_backends``, the same hook
third-party backends implement. Nothing here imports a vendor library at import
time; each backend's factory does, when that backend is selected.
"""
