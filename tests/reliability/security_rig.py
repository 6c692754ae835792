"""Shared helpers of the reliability/security tests: a real writer process with its live service."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# A capture-like writer: a Store holding the file, its LiveService advertised in the sidecar, a
# Recorder appending frames. Commands on stdin: "add" (10 more frames, prints the total), "count"
# (prints the frames and tables the writer itself sees), "quit".
WRITER = r'''
import sys
from workbench.decode.classify import Frame
from workbench.store import LiveService, Store
from workbench.store.db import SessionInfo, now_us
from workbench.store.recorder import Recorder

db = sys.argv[1]
store = Store(db)
svc = LiveService(store.con, db)
svc.start()
rec = Recorder(store)
rec.open_session(SessionInfo("live-session", transport="run", status="open"))
n = 0

def add(k):
    global n
    for _ in range(k):
        rec.add("live-session", now_us(), "server", "run", "1",
                Frame("interaction_update.text_delta", f"text {n}", b"\x0a\x02\x0a\x00"))
        n += 1
    rec.flush()

add(100)
print("ready", n, flush=True)
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "add":
        add(10)
        print(n, flush=True)
    elif cmd == "count":
        frames = store.query("SELECT count(*) FROM frames").column(0)[0].as_py()
        tables = store.query("SELECT string_agg(table_name, ',' ORDER BY table_name) FROM duckdb_tables()").column(0)[0].as_py()
        print(n, frames, tables, flush=True)
    elif cmd == "quit":
        break
svc.stop()
store.close()
print("closed", flush=True)
'''


class WriterProcess:
    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc

    def ask(self, cmd: str) -> str:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()


@contextmanager
def live_writer(db: Path) -> Iterator[WriterProcess]:
    """A writer process holding ``db`` and serving live reads (sidecar ``<db>.live.json``)."""
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(db)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("ready"), (first, proc.stderr.read() if proc.stderr else "")
        yield WriterProcess(proc)
        out, err = proc.communicate("quit\n", timeout=60)
        assert proc.returncode == 0, err
        assert "closed" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
