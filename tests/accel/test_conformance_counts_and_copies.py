"""The device-count and rng-copy conformance rules fail the backends they are meant for.

Each broken backend is a real plugin (a distribution with an ``accel.backends`` entry
point) written into a pytester directory, certified with ``python -m accel conformance``
in a fresh process, as a plugin author would.
"""

from __future__ import annotations

import os
import re
import sys
import textwrap

import pytest

TIMEOUT_S = 600.0  # a hang guard, generous for a loaded 2-core CI machine
_RULE = re.compile(r"conformance rule ([a-z0-9-]+) \(")

_PLUGIN = textwrap.dedent(
    '''
    import torch
    from backends._common import checked_index
    from backends.cpu import CpuBackend

    from accel import Availability, BackendSpec, hookimpl


    class CardCountBackend(CpuBackend):
        """Counts every card on the node but lets the process use index 0 only."""

        name = "fakecardcount"

        def device_count(self):
            return 8

        def device(self, index=None):
            if index is not None:
                checked_index(self.name, index, 1)
            return self.the_device


    class LiveStateBackend(CpuBackend):
        """Returns its live generator state, as the Gaudi bridge does in philox mode."""

        name = "fakelivestate"

        def __init__(self):
            self._live = torch.get_rng_state()

        def get_rng_state(self):
            self._live.copy_(torch.get_rng_state())
            return self._live

        def set_rng_state(self, state):
            self._live.copy_(state)
            torch.set_rng_state(self._live.clone())


    def _probe(count):
        return lambda: Availability(available=True, device_count=count)


    @hookimpl
    def accel_backends():
        return [
            BackendSpec(name="fakecardcount", factory=CardCountBackend, probe=_probe(8)),
            BackendSpec(name="fakelivestate", factory=LiveStateBackend, probe=_probe(1)),
        ]
    '''
)


@pytest.fixture
def plugin_dir(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    for name in list(os.environ):
        if name.startswith("ACCEL"):
            monkeypatch.delenv(name)
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(accel_fake_rules=_PLUGIN)
    info = pytester.mkdir("accel_fake_rules-1.0.dist-info")
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: accel-fake-rules\nVersion: 1.0\n", encoding="utf-8"
    )
    (info / "entry_points.txt").write_text(
        "[accel.backends]\nfakerules = accel_fake_rules\n", encoding="utf-8"
    )
    monkeypatch.setenv(
        "PYTHONPATH",
        os.pathsep.join(filter(None, [str(pytester.path), os.environ.get("PYTHONPATH")])),
    )
    return pytester


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
    plugin_dir: pytest.Pytester, backend: str, broken_rule: str, failing_tests: set[str]
) -> None:
    result = plugin_dir.run(
        sys.executable,
        "-m",
        "accel",
        "conformance",
        backend,
        "-p",
        "no:cacheprovider",
        "-rA",
        timeout=TIMEOUT_S,
    )
    output = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, output
    # A live state also breaks what depends on it (checkpoint replay); the new rule names
    # the cause.
    assert broken_rule in set(_RULE.findall(output)), output
    failed = {
        line[len("FAILED ") :].split(" - ", 1)[0].rsplit("[", 1)[0]
        for line in result.outlines
        if line.startswith("FAILED ")
    }
    assert failing_tests <= failed, output
    assert result.parseoutcomes().get("passed", 0) >= 15, output
