"""The recording runs in a child process of mitmdump (``cursor_writer=process``, the default):
real mitmdump, real ``workbench sim``, the built-in client, real DuckDB files."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from capture_rig import Sim, turn_with_mitmdump_killed
from mitmproxy.test import taddons
from support import session_row, wait_until

from workbench.capture.addon import EXIT_FRAMES_LOST, CursorCapture
from workbench.capture.child import NICE
from workbench.capture.flows import Chunk, Done, Eof, FlowOpen, Open
from workbench.capture.process import WriterProcess
from workbench.capture.writer import CaptureWriter
from workbench.client.agent import AgentClient
from workbench.schema.loader import load_schema
from workbench.store import open_reader
from workbench.store.live import live_pid, sidecar_path

pytestmark = pytest.mark.slow  # starts subprocesses or servers

TOKEN = "wb-test-token-proc-5d2e"


def _parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _nice(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def _running(pid: int) -> bool:
    """Alive and not a zombie (an exited child its parent has not reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _writer_pid(m: Any) -> int:
    """The pid serving the database's live reads: the process that holds it."""
    return wait_until(lambda: live_pid(m.db), timeout=60, what="the capture's live read service", proc=m.proc)


def _stored(db: Path, sid: str) -> Counter[tuple[str, bytes]]:
    rows = open_reader(db).query("SELECT direction, payload, kind FROM frames WHERE session_id = ? ORDER BY seq",
                                 [sid]).to_pylist()
    return Counter((r["direction"], r["payload"]) for r in rows if r["kind"] != "end_stream")


def _log(m: Any) -> str:
    return Path(str(m.db.parent / f"mitmdump-{m.port}.log")).read_text()


async def _turn_killing(c: AgentClient, writer: int, after_deltas: int = 40) -> int:
    """One long turn, the writer process killed (-9) after ``after_deltas`` text deltas; the deltas seen."""
    seen = 0
    killed = False
    async for ev in c.stream_turn("[scenario:long] go"):
        seen += type(ev).__name__ == "TextDelta"
        if seen == after_deltas and not killed:
            os.kill(writer, signal.SIGKILL)
            killed = True
    assert killed
    return seen


async def test_the_database_is_written_by_a_child_process(capture_sim: Sim, capture_mitm: Any,
                                                           capture_proxy_env: Any) -> None:
    m = capture_mitm()
    capture_proxy_env(m)
    writer = _writer_pid(m)
    assert writer != m.proc.pid
    assert _parent_of(writer) == m.proc.pid
    assert _nice(writer) == min(19, _nice(m.proc.pid) + NICE)  # forwarding goes first when CPUs are busy
    # A Ctrl-C in a terminal reaches the whole process group: the child leaves the stop to mitmdump.
    os.kill(writer, signal.SIGINT)
    async with AgentClient(capture_sim.url, TOKEN, transport="run", verify=str(m.ca)) as c:
        res = await asyncio.wait_for(c.run_turn("[scenario:text] hello", raise_on_error=False), 120)
        log, sid = list(c.frame_log), c.last_request_id
    assert res.error is None, res.error
    assert res.text
    assert _running(writer)
    assert m.stop(signal.SIGTERM) == 0  # mitmdump's shutdown stops the child in order: no orphan
    assert not _running(writer)
    stored = _stored(m.db, sid)
    missing = [e for e in log if stored[(e.direction, e.data)] == 0]
    assert not missing, f"{len(missing)} of {len(log)} frames missing"
    assert session_row(m.db, sid)["status"] == "complete"


@pytest.mark.parametrize("transport", ["run", "runsse"])
async def test_a_killed_writer_process_is_restarted_and_records_the_whole_turn(
        capture_sim: Sim, capture_mitm: Any, capture_proxy_env: Any, transport: str) -> None:
    """Over RunSSE the client's frames are BidiAppend exchanges: the restarted writer also goes on
    with the appends' ordering state and their run's session."""
    m = capture_mitm()
    capture_proxy_env(m)
    writer = _writer_pid(m)
    async with AgentClient(capture_sim.url, TOKEN, transport=transport, verify=str(m.ca)) as c:
        deltas = await _turn_killing(c, writer)
        log, sid = list(c.frame_log), c.last_request_id
    assert deltas == 150  # the proxy forwarded the whole turn all the same
    assert m.stop() == 0  # nothing lost: mitmdump exits as usual
    out = _log(m)
    assert f"capture writer process (pid {writer}) ended unexpectedly (status -9); restarting it (1 of 3)" in out
    assert "the capture writer process runs again" in out
    assert "LOST" not in out and "Traceback" not in out
    rows = open_reader(m.db).query("SELECT seq FROM frames WHERE session_id = ? ORDER BY seq", [sid]).to_pylist()
    assert [r["seq"] for r in rows] == list(range(len(rows)))  # no gap, no frame twice
    stored = _stored(m.db, sid)
    missing = [e for e in log if stored[(e.direction, e.data)] == 0]
    assert not missing, f"{len(missing)} of {len(log)} frames missing"
    passed = Counter((e.direction, e.data) for e in log)
    assert {k: stored[k] for k in passed} == passed  # each exactly as often as it passed: none twice
    # (over RunSSE the stream's own request, the BidiRequestId, is recorded too: the client logs no frame for it)
    assert all(n == 1 for k, n in stored.items() if k not in passed)
    assert session_row(m.db, sid)["status"] == "complete"


async def test_a_killed_writer_process_with_no_restart_left_is_reported_and_mitmdump_exits_non_zero(
        capture_sim: Sim, capture_mitm: Any, capture_proxy_env: Any) -> None:
    m = capture_mitm(extra=("--set", "cursor_writer_restarts=0"))
    capture_proxy_env(m)
    writer = _writer_pid(m)
    async with AgentClient(capture_sim.url, TOKEN, transport="run", verify=str(m.ca)) as c:
        deltas = await _turn_killing(c, writer)
    assert deltas == 150  # the proxy forwarded the whole turn all the same
    assert m.stop() == EXIT_FRAMES_LOST
    out = _log(m)
    assert f"capture writer process (pid {writer}) ended unexpectedly (status -9) and no restart is left" in out
    lost = re.findall(r"no restart is left \(0 done\): ([\d,]+) frames LOST so far", out)
    assert lost, out
    # at least every text delta that came after the kill (one chunk each) is counted
    final = re.findall(r"ERROR: the capture writer process died 1 times .*: ([\d,]+) frames LOST", out)
    assert final and int(final[-1].replace(",", "")) >= 150 - 40, out
    assert "Traceback" not in out


async def test_the_child_finishes_and_exits_when_mitmdump_is_killed(capture_sim: Sim, capture_mitm: Any,
                                                                     capture_proxy_env: Any) -> None:
    m = capture_mitm()
    capture_proxy_env(m)
    writer = _writer_pid(m)
    async with AgentClient(capture_sim.url, TOKEN, transport="run", verify=str(m.ca)) as c:
        killed_at, log, sid = await turn_with_mitmdump_killed(c, m)
    wait_until(lambda: not _running(writer), timeout=60, what="the writer process to exit after mitmdump")
    assert not sidecar_path(m.db).exists()  # it stopped its live read service in order
    stored = _stored(m.db, sid)
    # Everything that had passed the proxy a moment before the kill was handed over and committed,
    # not only what one flush interval had committed.
    before = [e for e in log if e.ts_us < killed_at - 50_000]
    assert len(before) > 40
    missing = [e for e in before if stored[(e.direction, e.data)] == 0]
    assert not missing, f"{len(missing)} frames that passed before the kill are missing"
    assert session_row(m.db, sid)["status"] != "open"  # settled by the child, not left for the next capture


# the addon's choice of writer (mitmproxy's taddons: no proxy; the child process is real) ---------

def test_running_starts_a_writer_process_and_done_collects_its_counters(tmp_path: Path) -> None:
    addon = CursorCapture()
    db = tmp_path / "proc.duckdb"
    stats = tmp_path / "stats.json"
    with taddons.context(addon) as tctx:
        tctx.configure(addon, cursor_db=str(db), cursor_flush_ms=40, cursor_live=False, cursor_stats_file=str(stats))
        addon.running()
        writer = addon.writer
        assert isinstance(writer, WriterProcess)
        assert writer.pid is not None and writer.pid != os.getpid()
        put = writer.queue.put
        put(Open(FlowOpen("k", "run", True, "api2.cursor.sh", "/agent.v1.AgentService/Run", 1, request_id="rid-p")))
        frame = b"\x00\x00\x00\x00\x04\x0a\x02\x6a\x00"
        for i in range(500):
            put(Chunk("k", "server", 2 + i, frame))
        put(Eof("k", "server", 600))
        put(Done("k", 601, None, {}))
        wait_until(lambda: writer.frames_committed >= 500, timeout=60, what="the child's confirmation of 500 frames")
        child = writer.pid
        addon.done()
        assert addon.writer is None
    assert not _running(child)
    assert writer.stats()["committed"] == writer.frames_committed == writer.frames_total == 500
    assert writer.lost == 0
    assert json.loads(stats.read_text())["committed"] == 500  # the child wrote the stats file
    assert session_row(db, "rid-p")["frame_count"] == 500


def test_a_writer_process_that_cannot_start_falls_back_to_a_thread(tmp_path: Path, monkeypatch: Any,
                                                                   caplog: Any) -> None:
    monkeypatch.setattr(sys, "executable", shutil.which("false"))  # the child exits at once
    addon = CursorCapture()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, cursor_db=str(tmp_path / "fb.duckdb"), cursor_live=False)
        addon.running()
        try:
            assert type(addon.writer) is CaptureWriter
        finally:
            addon.done()
    assert "recording in a thread of this process instead" in caplog.text


def test_a_schema_set_by_code_keeps_the_writer_in_this_process(tmp_path: Path) -> None:
    addon = CursorCapture()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, cursor_db=str(tmp_path / "sc.duckdb"), cursor_live=False)
        addon._schema = schema = load_schema()  # an object no option names: it cannot reach a child
        addon.running()
        try:
            assert type(addon.writer) is CaptureWriter
            assert addon.writer.decoder.schema is schema
        finally:
            addon.done()


def test_the_counters_file_says_restarts_and_what_no_child_will_record(tmp_path: Path, monkeypatch: Any) -> None:
    """The CLI's counter and exit report read ``cursor_stats_file``: after the last restart the
    chunks no child records are counted there too, not only in mitmdump's log."""
    at_exit: list[tuple[Any, ...]] = []  # ``done`` sets mitmdump's exit status at exit: not pytest's
    monkeypatch.setattr("workbench.capture.addon.atexit.register", lambda *a: at_exit.append(a))
    addon = CursorCapture()
    stats = tmp_path / "stats.json"
    with taddons.context(addon) as tctx:
        tctx.configure(addon, cursor_db=str(tmp_path / "gone.duckdb"), cursor_live=False,
                       cursor_stats_file=str(stats), cursor_writer_restarts=1)
        addon.running()
        writer = addon.writer
        assert isinstance(writer, WriterProcess)
        put = writer.queue.put
        put(Open(FlowOpen("k", "run", True, "api2.cursor.sh", "/agent.v1.AgentService/Run", 1, request_id="rid-g")))
        first = writer.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)  # restarted
        wait_until(lambda: writer.restarts == 1 and writer.pid not in (None, first), timeout=60,
                   what="the writer process's restart")
        assert writer.pid is not None
        os.kill(writer.pid, signal.SIGKILL)  # no restart left
        wait_until(lambda: writer.failed, timeout=60, what="the capture giving the writer process up")
        for i in range(50):
            put(Chunk("k", "server", 2 + i, b"\x00\x00\x00\x00\x04\x0a\x02\x6a\x00"))
        wait_until(lambda: writer.lost >= 50, timeout=30, what="the chunks after the last death counted lost")
        addon.done()
    written = json.loads(stats.read_text())
    assert written["writer_restarts"] == 1 and written["lost"] >= 50
    assert [a[1:] for a in at_exit] == [(EXIT_FRAMES_LOST,)]


@pytest.mark.parametrize(("option", "value", "says"), [
    ("cursor_backlog_mb", 0, "cursor_backlog_mb=0: must be 1 or more"),
    ("cursor_writer_restarts", -1, "cursor_writer_restarts=-1: must be 0 or more"),
])
def test_the_backlog_and_restart_options_are_checked(option: str, value: int, says: str) -> None:
    from mitmproxy import exceptions

    addon = CursorCapture()
    with taddons.context(addon) as tctx, pytest.raises(exceptions.OptionsError, match=re.escape(says)):
        tctx.configure(addon, **{option: value})
