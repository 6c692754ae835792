"""``demo --db`` and a live sidecar: only a capture proved to write the database stops the demo.

A sidecar left behind by a killed capture names a pid that may be running again (a reused pid, PID 1
in a container) or no pid at all the OS can hold; the demo believed the pid alone and refused its
own database (or crashed with OverflowError). A real capture is still refused.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support import free_port

from workbench.demo import check_replaceable, mark_demo
from workbench.errors import CliError
from workbench.store import LiveService, Store
from workbench.store.reader import sidecar_path


def _stale(db: Path, pid: int) -> None:
    side = sidecar_path(db)
    side.write_text(json.dumps({"url": f"http://127.0.0.1:{free_port()}", "token": "t", "pid": pid}))
    os.chmod(side, 0o600)


def test_a_stale_sidecar_does_not_stop_the_demo(tmp_path: Path) -> None:
    db = tmp_path / "demo.duckdb"
    mark_demo(db)
    for pid in (os.getpid(), 1, 2**40):
        _stale(db, pid)
        check_replaceable(db)  # the demo's own database, nobody writing it: replaceable


@pytest.mark.slow
def test_a_proved_capture_still_stops_the_demo(tmp_path: Path) -> None:
    db = tmp_path / "demo.duckdb"
    mark_demo(db)
    store = Store(db)
    svc = LiveService(store.con, db)
    svc.start()
    try:
        with pytest.raises(CliError, match=rf"a capture \(pid {os.getpid()}\) is writing it"):
            check_replaceable(db)
    finally:
        svc.stop()
        store.close()
