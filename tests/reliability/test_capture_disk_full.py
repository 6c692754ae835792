"""Disk full until stop: capture never exits 0 having lost frames (issue 12, item 5).

Real processes: ``workbench sim``, ``workbench capture`` (mitmdump + addon) and the plain-h2 test
client. The capture database and its first spool live on a small filesystem that fills up while
the capture runs; the second spool location (the user state dir) is a second small filesystem,
so it fills too and frames end up held in memory (bounded by ``cursor_hold_frames``) and then
lost. The test checks the exact accounting: at stop, exit status 3 and the number of frames
lost; on the next start, every spool merged; recorded + lost = every frame that crossed the proxy.

Two ways to get a full disk: a pair of small tmpfs mounts where the test may mount them (root),
otherwise (or with ``WORKBENCH_TEST_NO_MOUNT=1``) a per-process file-size limit (RLIMIT_FSIZE;
writes past it fail with EFBIG) on the capture process, a real fault injection that needs no
privileges.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from workbench.store import open_reader

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT / "tests" / "clients"))
from h2_agent_client import H2AgentClient  # noqa: E402

pytestmark = pytest.mark.slow  # starts subprocesses or servers

LONG = {"description": "a long paced turn", "steps": [
    {"kv_set": "system"}, {"kv_set": "user"}, {"text": "word " * 150, "chunks": 150},
    {"turn_ended": True}, {"end": "ok"}]}
HOLD_FRAMES = 50
LIMIT = 64 * 1024


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("https_proxy", "http_proxy", "all_proxy")}
    env.update(extra)
    return env


@dataclass
class FullDisk:
    """Where the database and the state dir live, and how the capture process meets a full disk."""

    db: Path
    state: Path
    fill: Callable[[], None]          # make the database's disk full (while capturing)
    free: Callable[[], None]          # give the space back (before the next start)
    preexec: Callable[[], None] | None = None


def _mount(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    try:
        return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _fill(directory: Path) -> None:
    with open(directory / "filler", "wb") as fh:
        with contextlib.suppress(OSError):
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()


def _limit_file_size() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[FullDisk]:
    a, b = tmp_path / "dbdisk", tmp_path / "statedisk"
    if os.geteuid() == 0 and not os.environ.get("WORKBENCH_TEST_NO_MOUNT") and _mount(a, "4m"):
        if not _mount(b, "64k"):
            subprocess.run(["umount", str(a)], check=False)
            pytest.fail("could mount one tmpfs but not a second")
        try:
            yield FullDisk(a / "cap.duckdb", b, fill=lambda: _fill(a), free=lambda: (a / "filler").unlink())
        finally:
            for m in (a, b):
                subprocess.run(["umount", "-l", str(m)], check=False)
        return
    # No mounts here: every file the capture process writes is limited to LIMIT bytes.
    a.mkdir()
    b.mkdir()
    yield FullDisk(a / "cap.duckdb", b, fill=lambda: None, free=lambda: None, preexec=_limit_file_size)


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[str]:
    scen = tmp_path / "scenarios"
    scen.mkdir()
    (scen / "long.json").write_text(json.dumps(LONG))
    proc = subprocess.Popen(
        [str(BIN / "workbench"), "sim", "--port", "0", "--pace", "0.005", "--heartbeat-interval", "30",
         "--cert-dir", str(tmp_path / "certs"), "--scenario-dir", str(scen), "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=_env())
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    assert url.startswith("https://"), url
    yield url
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)


def _start_capture(disk: FullDisk, confdir: Path, *extra: str,
                   preexec: Callable[[], None] | None = None) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [str(BIN / "workbench"), "capture", "--port", "0", "--db", str(disk.db), "--confdir", str(confdir),
         "--", "--set", "ssl_insecure=true", "--set", f"cursor_hold_frames={HOLD_FRAMES}", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=preexec,
        env=_env(XDG_STATE_HOME=str(disk.state)))
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    assert url.startswith("http://127.0.0.1:"), url
    return proc, url


def _stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def _is_subsequence(part: list[Any], whole: list[Any]) -> bool:
    it = iter(whole)
    return all(any(x == y for y in it) for x in part)


def test_disk_full_until_stop_reports_the_loss_and_merges_every_spool(full_disk: FullDisk, sim: str,
                                                                     tmp_path: Path) -> None:
    confdir = tmp_path / "mitmconf"
    proc, proxy = _start_capture(full_disk, confdir, preexec=full_disk.preexec)
    logs: dict[str, list[dict[str, Any]]] = {}
    try:
        for i in range(3):
            if i == 1:
                full_disk.fill()  # the disk fills up while the capture runs, and stays full
            rid = str(uuid.uuid4())
            log = tmp_path / f"turn{i}.ndjson"
            res = H2AgentClient(sim, token="disk-full-token", ca_file=str(confdir / "mitmproxy-ca-cert.pem"),
                                proxy=proxy, request_id=rid, timeout=120, log_path=log).run_turn("[scenario:long] go")
            assert res.completed, res.error  # the proxy kept working for the client
            logs[rid] = [json.loads(x) for x in log.read_text().splitlines()]
    finally:
        code, err = _stop(proc)
    total = sum(len(v) for v in logs.values())

    # At stop: exit status 3 and exactly how many frames were lost.
    assert code == 3, err[-3000:]
    m = re.search(r"ERROR: ([\d,]+) frames were lost", err)
    assert m, err[-3000:]
    lost = int(m.group(1).replace(",", ""))
    assert 0 < lost < total
    assert "No space left on device" in err or "File too large" in err
    assert "workbench/spool" in err  # the second location (user state dir) was tried

    # The next start, with space back, merges every spool location and deletes them.
    full_disk.free()
    proc2, _ = _start_capture(full_disk, confdir)
    code2, err2 = _stop(proc2)
    assert code2 == 0, err2[-3000:]
    assert "merged" in err2
    assert "frames LOST" not in err2
    assert not list(full_disk.state.rglob("*.spool"))
    assert not full_disk.db.with_name("cap.duckdb.spool").exists()

    r = open_reader(full_disk.db)
    try:
        stored = r.query("SELECT session_id, direction, payload FROM frames ORDER BY session_id, seq").to_pylist()
        sessions = {row["session_id"] for row in r.query("SELECT session_id FROM sessions").to_pylist()}
    finally:
        r.close()
    assert sessions <= set(logs)
    assert {row["session_id"] for row in stored} <= set(logs)
    assert len(stored) + lost == total  # nothing vanished without being counted
    for rid, entries in logs.items():
        for direction in ("client", "server"):
            got = [row["payload"].hex() for row in stored if row["session_id"] == rid and row["direction"] == direction]
            sent = [e["hex"] for e in entries if e["direction"] == direction]
            assert _is_subsequence(got, sent), f"{rid} {direction}: stored frames out of order or unknown"
