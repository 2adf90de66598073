"""The device-count and rng-copy conformance rules fail the backends they are meant for.

Each broken backend is a real plugin (``tests/data/rules_site``: a distribution with an
``accel.backends`` entry point), certified in a fresh process as a plugin author would,
in the one conformance run several tests read (``conftest.conformance_run``).
"""

from __future__ import annotations

from typing import Any

import pytest

# Each test here starts processes or whole pytest sessions: deselected by default (see
# [tool.pytest.ini_options]).
pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("backend", "broken_rule", "failing_tests"),
    [
        (
            "fakecardcount",
            "device-count",
            {"test_device_count.py::test_every_index_below_device_count_is_usable"},
        ),
        ("fakelivestate", "rng-copy", {"test_rng_copy.py::test_rng_state_is_a_copy"}),
    ],
)
def test_rule_fails_exactly_the_broken_backend(
    conformance_run: Any, backend: str, broken_rule: str, failing_tests: set[str]
) -> None:
    output = conformance_run.output
    assert conformance_run.returncode == pytest.ExitCode.TESTS_FAILED, output
    # A live state also breaks what depends on it (checkpoint replay); the new rule names
    # the cause.
    assert broken_rule in conformance_run.rules(backend), output
    failed = {test_id.rsplit("[", 1)[0] for test_id in conformance_run.ids("FAILED", backend)}
    assert failing_tests <= failed, output
    assert len(conformance_run.ids("PASSED", backend)) >= 15, output
