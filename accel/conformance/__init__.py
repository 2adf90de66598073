"""The conformance suite: the behaviour every :class:`accel.Accelerator` must have.

Certify a backend with one command::

    python -m accel conformance <name>

which runs ``python -m pytest -p accel.testing --pyargs accel.conformance --accel=<name>``.
Each failure message starts with ``conformance rule <id>:`` naming the rule broken.
Checks that need tensors on the device are skipped, with the reason, where the backend
cannot allocate them (for example a test double of a vendor library). A backend that is
unknown, unavailable here or in a name conflict cannot be certified: the command stops
with a usage error (exit status 4) saying why, instead of passing on skips.
"""

from ._rules import RULES, rule

__all__ = ["RULES", "rule"]
