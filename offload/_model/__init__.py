"""``OffloadModel``: a sequential model split into slices that visit the device in turn.

:mod:`.offload_model` is the public class; :mod:`.strategies` picks how slices reach the
device. The swap strategy's modules import one way: :mod:`.config` (what a pass needs)
before :mod:`.slice_run` (one slice's forward and backward) before :mod:`.run` (its
autograd Function); :mod:`.residency` holds the double buffers, :mod:`.slicing` cuts
and packs the model, :mod:`.boundary` moves values between slices; :mod:`.copied` is
the copy strategy.
"""
