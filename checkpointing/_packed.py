"""Dropout masks on the host stored as booleans: a quarter of the bytes, rebuilt exactly.

On the host, dropout draws its mask into a float tensor (``bernoulli_``) and scales it
in place by ``1/(1-p)``, so the mask autograd saves holds two values, 0 and that scale.
:class:`Packed` keeps one boolean per element and the scale, and rebuilds the tensor
bit for bit: ``flag * scale`` is the scale or +0.0. :meth:`Packed.of` packs only a
tensor it has checked to be two-valued this way. The check reads the mask twice more and
writes a float tensor of its size, which costs more than the packing itself on the host
(a fresh allocation of that size faults its pages in), so a saved-tensor call checks
its masks on its first call of each input layout, alongside its recipes, and later calls
of that layout pack the same positions unchecked (``check=False``).
"""

from __future__ import annotations

import torch

from ._replay import Geometry

__all__ = ["Packed"]


class Packed:
    """A float tensor of zeros and one scale of at least 1, stored as booleans.

    The tensor must cover its whole storage (any strides, as a transposed mask has).
    """

    def __init__(self, flags: torch.Tensor, scale: torch.Tensor, geometry: Geometry) -> None:
        self.flags = flags
        self.scale = scale
        self.geometry = geometry

    @staticmethod
    def of(tensor: torch.Tensor, check: bool = True) -> Packed | None:
        """Pack ``tensor`` if every element is 0 or its largest value; else ``None``.

        The largest value must be finite and at least 1 (dropout's ``1/(1-p)``): then
        ``x * (x - scale)`` is zero exactly where ``x`` is 0 or the scale, with no
        underflow to a false zero, so one product checks every element.

        Args:
            tensor: The float tensor to pack, covering its whole storage.
            check: Check every element. ``False`` trusts that a checked call of the same
                code at the same position found it two-valued (the largest value is
                still checked): only :class:`._saved_run.SavedRun` passes it, on calls
                after a checked one.
        """
        if not tensor.dtype.is_floating_point or tensor.numel() == 0:
            return None
        dense = tensor.storage_offset() == 0 and (
            tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
        )
        if not dense:  # a view of part of a storage, or an expanded one
            return None
        scale = tensor.amax()
        if not bool((scale >= 1) & scale.isfinite()):
            return None
        if check and bool((tensor - scale).mul_(tensor).any()):
            return None
        flags = tensor.to(torch.bool)  # keeps the strides of a dense tensor
        if flags.stride() != tensor.stride():
            return None
        return Packed(flags, scale, Geometry.of(tensor))

    def unpack(self) -> torch.Tensor:
        """The tensor as it was packed.

        The flags are read as bytes: on the host, converting ``uint8`` to float takes
        half the time of converting ``bool`` (254 against 492 us for a 2 MiB mask on the
        Xeon, one thread), and gives the same 0 and 1.
        """
        return self.flags.view(torch.uint8).to(self.scale.dtype).mul_(self.scale)
