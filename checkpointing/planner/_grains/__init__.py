"""The grains: each way to checkpoint a module call as one named strategy.

A grain (:class:`Grain`, in ``_base``) owns its name, its options for a module call, its
payload in a plan (a :class:`Decision` holds the grain's name and payload), how the
payload is checked, its wrapper, its JSON, its margin in the search and, where it has
one, its compiled form. One module per grain: ``_whole`` (``"checkpoint"``),
``_saved`` (``"recompute saved"``), ``_operator_class`` (``"recompute cheap ops"``,
with torchtitan's rule as its option), ``_chosen`` (``"keep costly ops"``) and
``_keep`` (``"keep"``). ``_registry`` lists them.
"""

from __future__ import annotations

from ._base import Decision, Grain, PayloadFree
from ._registry import (
    GRAINS,
    candidates,
    coarseness_order,
    compiled_forms,
    decode_decision,
    encode_decision,
    grain_named,
    margins,
    options_of,
)

__all__ = [
    "GRAINS",
    "Decision",
    "Grain",
    "PayloadFree",
    "candidates",
    "coarseness_order",
    "compiled_forms",
    "decode_decision",
    "encode_decision",
    "grain_named",
    "margins",
    "options_of",
]
