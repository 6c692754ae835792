"""The report tests read the same recording as the diff tests (tests/diff/conftest.py): the demo's
healthy tool flow, its heartbeat loop and a text turn, recorded from the simulated backend."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "web"))  # web_rig: the headless Chromium rig

from diff.conftest import record_demo  # noqa: E402  (tests/ is on sys.path: support, diff.conftest)


@pytest.fixture(scope="session")
def report_demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    db = tmp_path_factory.mktemp("report") / "demo.duckdb"
    return db, record_demo(db)


@pytest.fixture
def need_chromium() -> str:
    from web_rig import require_chromium

    return require_chromium()
