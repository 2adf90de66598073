"""The transfer core both wrappers share: host storage, copies, device memory, gradients.

* :mod:`.transfer`: the copy streams and the protocol calls that order work around them,
  the host pool for activations, and resolving the backend and device;
* :mod:`.storage`: parameters and buffers packed into flat page-locked host tensors;
* :mod:`.host_grads`: host memory for gradients coming home;
* :mod:`.copies`: parameters that reach the device as differentiable copies;
* :mod:`.strategy`: which of the two strategies a device takes.

Nothing here imports :mod:`offload._model` or :mod:`offload._params`.
"""
