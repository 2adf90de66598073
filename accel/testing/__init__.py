"""Testing on every backend: a pytest plugin, the recording backend, the conformance suite.

Enable the plugin with ``-p accel.testing`` or ``pytest_plugins = ["accel.testing"]`` in
your top-level ``conftest.py`` (it is not auto-loaded). Then:

* ``--accel=cpu,cuda`` / ``--accel=all`` / ``--accel=available`` (the default; also the
  ``ACCEL_TEST_BACKENDS`` variable) chooses the backends;
* a test that takes the ``accel_backend`` fixture runs once per chosen backend, with ids
  like ``test_step[cuda]``; with ``all`` or ``available``, a backend that cannot run
  here is skipped with the reason, while one named explicitly that cannot run (or is
  unknown) stops the session with a usage error;
* ``@pytest.mark.accel("cuda", "hpu")`` limits a test to those backends (an unknown
  name is a usage error);
* ``@pytest.mark.accel_requires("streams")`` skips backends lacking a capability
  (see :data:`CAPABILITIES`).

:class:`RecordingBackend` records every protocol call so tests can assert on their order.
Backend authors certify a backend with ``python -m accel conformance <name>``.
"""

from __future__ import annotations

from backends.recording import Call, RecordingBackend

from ._plugin import (
    CAPABILITIES,
    BackendSelection,
    accel_backend,
    pytest_addoption,
    pytest_configure,
    pytest_generate_tests,
    pytest_report_header,
)

__all__ = [
    "BackendSelection",
    "CAPABILITIES",
    "Call",
    "RecordingBackend",
    "accel_backend",
    "pytest_addoption",
    "pytest_configure",
    "pytest_generate_tests",
    "pytest_report_header",
]
