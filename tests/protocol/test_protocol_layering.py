"""``workbench.protocol`` sits below every user of it: importing it loads none of them."""

from __future__ import annotations

import subprocess
import sys

import pytest

FORBIDDEN = ("workbench.capture", "workbench.ingest", "workbench.client", "workbench.sim", "workbench.analysis",
             "workbench.tui", "workbench.fixtures", "workbench.proxy", "mitmproxy", "textual")


@pytest.mark.slow  # a fresh interpreter, so nothing another test imported counts
def test_the_protocol_package_imports_nothing_above_it() -> None:
    code = ("import sys, pkgutil, importlib, workbench.protocol as p\n"
            "for m in pkgutil.iter_modules(p.__path__): importlib.import_module('workbench.protocol.' + m.name)\n"
            "from workbench.protocol.status import h2_error_name; h2_error_name(8)\n"
            "from workbench.protocol.run_request import run_request_facts; run_request_facts('run_request', b'')\n"
            "print('\\n'.join(sorted(sys.modules)))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert "workbench.protocol.status" in loaded
    assert [m for m in loaded if m.startswith(FORBIDDEN)] == []
