"""The transfer core both wrappers share: host storage, copies, device memory, gradients.

* :mod:`.transfer`: the copy streams and the protocol calls that order work around them,
  the host pool for activations, and resolving the backend and device;
* :mod:`.storage`: parameters and buffers packed into flat page-locked host tensors;
* :mod:`.host_grads`: host memory for gradients coming home;
* :mod:`.copies`: parameters that reach the device as differentiable copies, and
  :mod:`.copier`: those copies in device memory kept from step to step;
* :mod:`.pool`: device memory kept across steps and handed out again;
* :mod:`.grads`: where gradients go (fixed device memory, written in place), and
  :mod:`.intercept`: the layers that write them there;
* :mod:`.strategy`: which of the two strategies a device takes.

Nothing here imports :mod:`offload._model` or :mod:`offload._params`.
"""
