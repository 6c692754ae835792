"""``workbench run -- CMD ARGS…``: run a CLI (``cursor-agent -p --output-format stream-json …``),
pass its output through unchanged and record its stream-json NDJSON live.

stdout is copied byte for byte as it arrives (a consumer downstream sees exactly what it would
without us); stderr and stdin are inherited, so they are untouched by construction. Each complete
stdout line becomes a ``cli_ndjson`` frame stamped with its arrival time. Frames are committed in
batches at most ``flush_ms`` apart, and the database is served to live readers (``LiveService``)
for the whole run, so ``workbench frames --follow`` and the TUI can watch it.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from types import FrameType
from typing import BinaryIO

from workbench.errors import CliError
from workbench.ingest import open_store
from workbench.ingest.ndjson import NdjsonRecorder
from workbench.redact import is_secret_header, marker
from workbench.store.db import now_us
from workbench.store.reader import LiveService
from workbench.store.recorder import Recorder
from workbench.textsafe import escape_display

SOURCE = "run:ndjson"
_SECRET_FLAGS = ("--api-key", "--token", "--auth-token")


def redact_argv(argv: Sequence[str]) -> list[str]:
    """The command line as stored: values of credential flags and secret ``-H`` headers hidden."""
    out: list[str] = []
    prev = ""
    for a in argv:
        if prev in _SECRET_FLAGS:
            a = marker(a)
        elif prev in ("-H", "--header") and ":" in a:
            name, value = a.split(":", 1)
            if is_secret_header(name.strip()):
                a = f"{name}: {marker(value.strip())}"
        else:
            for flag in _SECRET_FLAGS:
                if a.startswith(flag + "="):
                    a = f"{flag}={marker(a[len(flag) + 1:])}"
        out.append(a)
        prev = a if not a.startswith("[redacted") else ""
    return out


def _write_all(out: BinaryIO | None, data: bytes) -> BinaryIO | None:
    """Pass bytes on; a closed consumer stops the passthrough, not the recording."""
    if out is None:
        return None
    try:
        out.write(data)
        out.flush()
    except (BrokenPipeError, ValueError, OSError):
        return None
    return out


class _Lost:
    """stdout lines that could not be recorded (passed on all the same), reported once each."""

    def __init__(self) -> None:
        self.lines: list[int] = []

    def add(self, lineno: int, exc: BaseException) -> None:
        self.lines.append(lineno)
        # the error may quote the line: through the printer (workbench.textsafe)
        print(f"workbench run: stdout line {lineno} was passed on but not recorded: "
              f"{type(exc).__name__}: {escape_display(str(exc)[:200])}", file=sys.stderr, flush=True)


def run_and_record(cmd: Sequence[str], db: str, *, out: BinaryIO | None = None,
                   flush_ms: int = 250) -> int:
    """Run ``cmd``; returns its exit code (128 + signal number when a signal ended it)."""
    if not cmd:
        raise CliError("no command given (usage: workbench run [--db PATH] -- CMD ARGS…)")
    out = out if out is not None else sys.stdout.buffer
    if os.sep not in cmd[0] and shutil.which(cmd[0]) is None:
        raise CliError(f"cannot run {cmd[0]!r}: not found on PATH")
    store = open_store(db)
    try:
        proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, bufsize=0)
    except OSError as exc:
        store.close()
        raise CliError(f"cannot run {cmd[0]!r}: {exc.strerror or exc}") from exc
    live = LiveService(store.con, db)
    live.start()
    rec = Recorder(store)
    started = now_us()
    meta = {"command": redact_argv(cmd), "pid": proc.pid, "format": "stream-json",
            "timing": "arrival time of each stdout line"}
    sink = NdjsonRecorder(rec, SOURCE, meta, fallback_session=lambda: f"run-{uuid.uuid4()}",
                          fallback_ts=now_us, live_clock=True)

    def forward(signum: int, _frame: FrameType | None) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    # Ctrl-C reaches the child through the terminal's process group: we keep reading until it
    # exits so its last lines are recorded. SIGTERM is forwarded.
    old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    old_term = signal.signal(signal.SIGTERM, forward)
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    interval = flush_ms / 1000
    buf = b""
    lineno = 0
    last_flush = time.monotonic()
    sink_out: BinaryIO | None = out
    lost = _Lost()

    def feed(line: bytes, n: int, arrival: int) -> None:
        # The CLI is the user's: whatever a line does to the recording, the CLI goes on, its output
        # is passed on, and the lines after it are recorded. A line that cannot be recorded is
        # counted (and said), never a reason to stop.
        try:
            sink.feed(line, n, arrival)
        except Exception as exc:  # any failure of one line's recording
            lost.add(n, exc)

    try:
        while True:
            pending = len(rec.batch) > 0
            timeout = max(0.0, last_flush + interval - time.monotonic()) if pending else None
            ready, _, _ = select.select([fd], [], [], timeout)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                sink_out = _write_all(sink_out, chunk)
                arrival = now_us()
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    lineno += 1
                    feed(line, lineno, arrival)
            if time.monotonic() - last_flush >= interval:
                rec.flush()
                last_flush = time.monotonic()
        if buf:
            lineno += 1
            feed(buf, lineno, now_us())
        rc = proc.wait()
        code = rc if rc >= 0 else 128 - rc
        ended = (f"the CLI exited with code {code} without a result event" if rc >= 0
                 else f"the CLI was killed by signal {-rc} before a result event")
        sink.finish(ended)
        for sid in sink.session_ids:
            info = rec.sessions[sid]
            info.meta["exit_code"] = code
            info.meta["run_started_us"] = started
            if lost.lines:
                info.meta["lines_not_recorded"] = lost.lines
            rec.touch(sid)
        rec.flush()
        from workbench.analysis.stored import refresh_findings  # loads the analysis once the run is over

        refresh_findings(store, list(sink.session_ids))  # findings stored when the recorded run ends
        return code
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        live.stop()
        store.close()
