"""The writer process under a flood through real mitmdump (``flood_rig``): killed with ``kill -9``
mid-flood it is restarted and the capture records every frame exactly once (recorded + lost ==
sent, no duplicate); stopped (SIGSTOP) while the flood goes on, the backlog goes to disk and
mitmdump's memory stays bounded, and once it runs again (SIGCONT) everything is recorded, in order.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest
from flood_rig import flood_upstream, run_flood
from support import wait_until

from workbench.protocol import kinds
from workbench.store import open_reader
from workbench.store.live import live_pid

pytestmark = pytest.mark.slow  # starts mitmdump, floods it

MiB = 2**20


def _writer_pid(m: Any) -> int:
    return wait_until(lambda: live_pid(m.db), timeout=60, what="the capture's live read service", proc=m.proc)


def _log(m: Any) -> str:
    return Path(str(m.db.parent / f"mitmdump-{m.port}.log")).read_text()


def _recorded(db: Path, sid: str) -> list[dict[str, Any]]:
    rows = open_reader(db).query("SELECT seq, direction, kind, payload FROM frames WHERE session_id = ? ORDER BY seq",
                                 [sid]).to_pylist()
    return [r for r in rows if not kinds.is_end_stream(r["kind"])]


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _backlog_file(pid: int) -> Path | None:
    """The backlog's scratch file mitmdump holds open (it is unlinked: only the fd shows it)."""
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if ".backlog" in os.readlink(fd):
                return fd
        except OSError:
            continue
    return None


def _backlog_bytes(pid: int) -> int:
    fd = _backlog_file(pid)
    return os.stat(fd).st_size if fd is not None else 0


async def test_writer_killed_mid_flood_is_restarted_and_every_frame_is_recorded_once(
        capture_mitm: Any, capture_proxy_env: Any, tmp_path: Path) -> None:
    n = 20_000
    upstream = await flood_upstream(n, 200, tmp_path / "certs")
    m = capture_mitm()
    capture_proxy_env(m)
    writer = _writer_pid(m)
    killed: list[int] = []

    def kill_once(i: int) -> None:
        if i == n // 4 and not killed:
            os.kill(writer, signal.SIGKILL)
            killed.append(i)

    try:
        flood = await run_flood(upstream.url, m.ca, kill_once)
    finally:
        await upstream.close()
    assert killed and len(flood.frames) == n  # the proxy forwarded the whole flood all the same
    status = m.stop()
    out = _log(m)
    replayed = re.findall(rf"process \(pid {writer}\) ended unexpectedly \(status -9\); restarting it \(1 of 3\) "
                          r"to replay the ([\d,]+) batches it had not confirmed", out)
    assert replayed, out
    assert "the capture writer process runs again" in out and "Traceback" not in out
    lost_said = re.findall(r"ERROR: ([\d,]+) frames LOST", out)
    lost = int(lost_said[-1].replace(",", "")) if lost_said else 0
    assert status == (3 if lost else 0), out

    rows = _recorded(m.db, flood.request_id)
    assert [r["seq"] for r in rows] == list(range(len(rows)))  # numbered without gaps: nothing twice
    sent = [("client", flood.run_request)] + [("server", p) for p in flood.frames]
    recorded = [(r["direction"], r["payload"]) for r in rows]
    assert len(set(recorded)) == len(recorded)  # each frame is unique (its index): none recorded twice
    assert len(recorded) + lost == len(sent)
    assert set(recorded) <= set(sent)
    # every frame after the kill is recorded (the replay and the new child), in the order it passed
    after = sent[killed[0] + 1:]
    assert recorded[-len(after):] == after
    assert lost == 0 and recorded == sent  # nothing the dead child had not confirmed was lost


async def test_a_stopped_writer_spools_the_backlog_to_disk_and_catches_up_in_order(
        capture_mitm: Any, capture_proxy_env: Any, tmp_path: Path) -> None:
    n, size = 12_000, 2_500  # 30 MB through the proxy while the writer process is stopped
    upstream = await flood_upstream(n, size, tmp_path / "certs")
    m = capture_mitm(extra=("--set", "cursor_backlog_mb=2", "--set", "cursor_view_bytes=0"))
    capture_proxy_env(m)
    writer = _writer_pid(m)
    before = _rss(m.proc.pid)
    os.kill(writer, signal.SIGSTOP)
    try:
        try:
            flood = await run_flood(upstream.url, m.ca)
        finally:
            await upstream.close()
        assert len(flood.frames) == n  # forwarding does not wait for the writer
        spooled = wait_until(lambda: _backlog_bytes(m.proc.pid) >= 20 * MiB and _backlog_bytes(m.proc.pid),
                             timeout=60, what="the backlog to go to disk")
        grown = _rss(m.proc.pid) - before
        backlog = _backlog_file(m.proc.pid)
        assert backlog is not None
        # raw wire bytes (credentials too, in real traffic) are never on disk in clear
        assert flood.frames[-1][-64:] not in backlog.read_bytes()
    finally:
        os.kill(writer, signal.SIGCONT)
    print(f"backlog on disk {spooled / MiB:.1f} MiB, mitmdump grew by {grown / MiB:.1f} MiB")
    assert grown < 16 * MiB, f"mitmdump grew by {grown / MiB:.1f} MiB while {spooled / MiB:.1f} MiB went to disk"
    # the writer catches up: every frame recorded, in the order it passed
    wait_until(lambda: _backlog_bytes(m.proc.pid) == 0, timeout=120, what="the backlog to drain")
    assert m.stop() == 0
    out = _log(m)
    assert "is behind by over 2 MiB: batches go to" in out and "caught up" in out, out
    assert "LOST" not in out and "Traceback" not in out
    rows = _recorded(m.db, flood.request_id)
    assert [r["payload"] for r in rows] == [flood.run_request, *flood.frames]
    assert [r["seq"] for r in rows] == list(range(len(rows)))
