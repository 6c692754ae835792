"""A packet capture's sessions are written while tshark still reads the file (issue 24).

tshark runs on one core while the importer works on another: an HTTP/2 Run whose connection has
ended is decoded and stored before tshark is done. Observed with real tshark on a real capture:
tshark is started through a wrapper that, once tshark has written everything, keeps its output
open until the test has seen the first session in the database. An importer that waits for the
end of tshark's output never gets there.
"""

from __future__ import annotations

import asyncio
import shutil
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import packet_capture_env
import pytest
from pcap_rig import Tcpdump, import_pcap, keylog_context, python_turns
from support import query_rows, wait_until

from workbench.analysis.ahead import FindingsAhead
from workbench.analysis.conversations import Conversations
from workbench.analysis.stored import refresh_findings
from workbench.ingest import ImportResult, IngestError, import_file
from workbench.sim.runner import SimThread
from workbench.store.db import Store

pytestmark = pytest.mark.slow

HOLD = """#!/bin/sh
# tshark, whose output stays open after the last packet until {release} exists (at most 5 minutes)
case "$1" in --version) exec {tshark} "$@" ;; esac
{tshark} "$@"
status=$?
n=0
while [ ! -e {release} ] && [ $n -lt 3000 ]; do sleep 0.1; n=$((n + 1)); done
exit $status
"""


@pytest.fixture(autouse=True, scope="module")
def _packet_capture_possible() -> None:
    packet_capture_env.need()


@pytest.fixture(scope="module")
def two_connections(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """Two built-in clients one after the other, each an h2 connection with one Run."""
    out = tmp_path_factory.mktemp("pcap-pipelined")
    keylog, pcap = out / "keys.log", out / "run.pcap"
    with SimThread(heartbeat_interval=0.1, cert_dir=out / "certs") as sim:
        ctx = keylog_context(sim.cert_path or "", keylog, ("h2", "http/1.1"))
        with Tcpdump(pcap, sim.port):
            for prompt in ("[scenario:tool_flow] first", "[scenario:tool_flow] second"):
                turns = asyncio.run(python_turns(sim.url, ctx, [prompt], transport="run"))
                assert turns.errors == [None]
    yield pcap, keylog


def _held_tshark(tmp_path: Path) -> tuple[Path, Path]:
    real = shutil.which("tshark")
    assert real
    release = tmp_path / "release"
    wrapper = tmp_path / "tshark-held"
    wrapper.write_text(HOLD.format(tshark=real, release=release))
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return wrapper, release


def test_sessions_are_stored_while_tshark_still_reads(two_connections: tuple[Path, Path], tmp_path: Path) -> None:
    pcap, keylog = two_connections
    wrapper, release = _held_tshark(tmp_path)
    db = tmp_path / "pipelined.duckdb"
    store = Store(db)
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = import_file(pcap, store, options={"keylog": str(keylog), "tshark": str(wrapper)})
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            outcome["error"] = exc

    importer = threading.Thread(target=run, daemon=True)
    importer.start()
    reader = store.con.cursor()
    try:
        early = wait_until(lambda: reader.execute("SELECT session_id, frame_count FROM sessions").fetchall(),
                           timeout=120, what="a session stored while tshark's output is still open")
        assert importer.is_alive() and not release.exists()  # tshark's output is still open
    finally:
        release.touch()
        importer.join(120)
        reader.close()
    assert "error" not in outcome, outcome
    result: ImportResult = outcome["result"]
    store.close()
    assert result.sessions == 2 and result.frames > 0
    # the sessions stored early are the ones of the finished import, whole
    final = {r["session_id"]: r["frame_count"] for r in query_rows(db, "SELECT session_id, frame_count FROM sessions")}
    assert set(final) == set(result.session_ids)
    for sid, count in early:
        assert final[sid] == count and count > 0

    # and what is stored is what the command stores with tshark itself
    plain = tmp_path / "plain.duckdb"
    done = import_pcap(pcap, plain, keylog)
    assert done.returncode == 0, done.stderr
    for sql in ("SELECT * FROM frames ORDER BY session_id, seq", "SELECT * FROM sessions ORDER BY session_id"):
        assert query_rows(db, sql) == query_rows(plain, sql)


def test_a_failure_after_sessions_were_stored_early_leaves_nothing(two_connections: tuple[Path, Path],
                                                                   tmp_path: Path) -> None:
    """tshark's output turns bad after both connections ended (and their Runs were stored): the
    import fails naming the file and, as before, nothing of it stays."""
    pcap, keylog = two_connections
    real = shutil.which("tshark")
    wrapper = tmp_path / "tshark-bad-tail"
    wrapper.write_text(f'#!/bin/sh\ncase "$1" in --version) exec {real} "$@" ;; esac\n{real} "$@"\n'
                       f'echo "this is not a line of fields"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    db = tmp_path / "failed.duckdb"
    store = Store(db)
    try:
        with pytest.raises(IngestError, match=f"{pcap}: tshark wrote a line without its .* fields.*nothing imported"):
            import_file(pcap, store, options={"keylog": str(keylog), "tshark": str(wrapper)})
    finally:
        store.close()
    assert query_rows(db, "SELECT count(*) AS n FROM sessions") == [{"n": 0}]
    assert query_rows(db, "SELECT count(*) AS n FROM frames") == [{"n": 0}]


def _analysis_rows(db: Path) -> dict[str, list[dict[str, Any]]]:
    """Every row the analysis stores, but the moment it was written."""
    return {"findings": query_rows(db, "SELECT * EXCLUDE (created_at) FROM findings ORDER BY ALL"),
            "blobs": query_rows(db, "SELECT * FROM blobs ORDER BY ALL"),
            "tool_calls": query_rows(db, "SELECT * FROM tool_calls ORDER BY ALL"),
            "meta": query_rows(db, "SELECT key, value FROM meta ORDER BY key")}


def test_findings_of_sessions_stored_early_are_computed_while_tshark_still_reads(
        two_connections: tuple[Path, Path], tmp_path: Path) -> None:
    """The Runs written while tshark's output is still open are analysed then too; at the end their
    results are stored as they are, and every row is what a refresh after the whole import stores."""
    pcap, keylog = two_connections
    wrapper, release = _held_tshark(tmp_path)
    db = tmp_path / "ahead.duckdb"
    store = Store(db)
    ahead = FindingsAhead(store)
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = import_file(pcap, store, options={"keylog": str(keylog), "tshark": str(wrapper)},
                                            findings=ahead)
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            outcome["error"] = exc

    importer = threading.Thread(target=run, daemon=True)
    importer.start()
    try:
        wait_until(lambda: len(ahead.done) == 2, timeout=120,
                   what="both sessions analysed while tshark's output is still open")
        assert importer.is_alive() and not release.exists()
    finally:
        release.touch()
        importer.join(120)
    assert "error" not in outcome, outcome
    result: ImportResult = outcome["result"]
    assert set(ahead.done) == set(result.session_ids)
    # the second session's findings stand; the first one's rules read the inputs of the sessions
    # that started after it (a client replaying a call's args), which the second one changed
    valid = ahead.still_valid(result.session_ids, Conversations(store))
    assert list(valid) == result.session_ids[1:], (list(valid), result.session_ids)
    assert ahead.done[result.session_ids[0]].inputs.later == []  # none had started when it was analysed
    assert set(refresh_findings(store, result.session_ids, ahead=ahead)) == set(result.session_ids)
    store.close()

    # the same capture, findings computed once the whole import is over
    plain = tmp_path / "plain.duckdb"
    other = Store(plain)
    try:
        ids = import_file(pcap, other, options={"keylog": str(keylog)}).session_ids
        refresh_findings(other, ids)
    finally:
        other.close()
    rows = _analysis_rows(db)
    assert rows["blobs"] and rows["meta"]
    assert rows == _analysis_rows(plain)
