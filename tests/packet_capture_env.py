"""Can the packet-capture tests run here? If not: skip with the reason, or fail in CI.

The pcap import and ``capture --keylog`` tests record real packets on ``lo``: they need tcpdump
and tshark (dumpcap comes with tshark) and root. On a developer's machine a missing part skips
them and says which part. In CI a skip would pass silently over the whole feature, so there a
missing part fails each of those tests instead. "In CI" means ``WORKBENCH_REQUIRE_PCAP=1``
(``.ci/run`` sets it) or, as for the other suites, the ``CI`` variable that CI services set;
``WORKBENCH_REQUIRE_PCAP=0`` turns the requirement off explicitly.

Importable as ``packet_capture_env`` from any test module (``tests/`` is on ``sys.path``).
"""

from __future__ import annotations

import os
import shutil

import pytest

REQUIRE_VARIABLE = "WORKBENCH_REQUIRE_PCAP"
INSTALL = "apt-get install tcpdump tshark"


def required() -> bool:
    """Whether a missing capture prerequisite is a failure (CI) rather than a skip."""
    explicit = os.environ.get(REQUIRE_VARIABLE)
    if explicit is not None and explicit.strip() != "":
        return explicit.strip() not in ("0", "false", "no")
    return bool(os.environ.get("CI"))


def missing(*tools: str) -> str | None:
    """What packet capture on loopback lacks here (``tools`` besides tcpdump and tshark), or None."""
    for tool in ("tcpdump", "tshark", *tools):
        if shutil.which(tool) is None:
            return f"{tool} is not installed ({INSTALL})"
    if os.geteuid() != 0:
        return "capturing on lo needs root (the tests run as root here and in CI)"
    return None


def unavailable(reason: str) -> None:
    """Skip the running test with ``reason``, or fail it when capture is required (CI)."""
    if required():
        pytest.fail(f"packet capture is required here ({REQUIRE_VARIABLE} or CI is set) but {reason}",
                    pytrace=False)
    pytest.skip(f"packet capture impossible here: {reason}")


def need(*tools: str) -> None:
    """Stop the running test (skip, or fail in CI) unless packet capture with ``tools`` is possible."""
    reason = missing(*tools)
    if reason is not None:
        unavailable(reason)
