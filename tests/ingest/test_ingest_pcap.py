"""Packet captures with a TLS key log: real TLS, real packets (tcpdump on lo), tshark as the dissector.

The built-in client (keys through ``SSLContext.keylog_filename``) and the Node.js test client
(``--tls-keylog`` / ``NODE_OPTIONS``) talk to ``workbench sim`` over HTTP/2 ``Run`` and HTTP/1.1
``RunSSE`` + ``BidiAppend`` while tcpdump records loopback. The imported sessions must hold every
frame byte for byte as the client logged it, in the right direction and order, at monotonic wire
times; the same faults must give the same findings as the client's own recording of the run.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import packet_capture_env
import pytest
from pcap_rig import (
    BIN,
    Tcpdump,
    agent_messages,
    answers_follow_questions,
    frames_of,
    import_pcap,
    is_agent_message,
    keylog_context,
    node_log,
    node_turn,
    packets_matching,
    python_turns,
    replayed_later,
    unanswered_append,
)
from support import query_rows

from workbench.analysis import analyze
from workbench.client.events import ExecRequest
from workbench.sim.runner import SimThread
from workbench.store.db import Store

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True, scope="module")
def _packet_capture_possible() -> None:
    """Before anything of this module starts: skip (or fail in CI) without tcpdump, tshark and root."""
    packet_capture_env.need()
ALPN = {"run": ("h2", "http/1.1"), "runsse": ("http/1.1",), "runpoll": ("http/1.1",)}


@pytest.fixture(scope="module")
def pcap_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimThread]:
    with SimThread(heartbeat_interval=0.1, cert_dir=tmp_path_factory.mktemp("pcap-sim-certs")) as sim:
        yield sim


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    (ws / "README.md").write_text("# demo\nhello\n")
    return ws


def _record_python(tmp_path: Path, sim: SimThread, prompts: list[str], *, transport: str = "run",
                   record_to: Any = None, **kw: Any) -> tuple[Path, Path, Any]:
    """One built-in client session captured on lo; (pcap, key log, the client's turns)."""
    keylog, pcap = tmp_path / "keys.log", tmp_path / f"{transport}.pcap"
    ctx = keylog_context(sim.cert_path or "", keylog, ALPN[transport])
    with Tcpdump(pcap, sim.port):
        turns = asyncio.run(python_turns(sim.url, ctx, prompts, transport=transport, record_to=record_to, **kw))
    return pcap, keylog, turns


def _session(db: Path, request_id: str) -> dict[str, Any]:
    rows = query_rows(db, "SELECT * FROM sessions WHERE request_id = ? AND transport <> 'bidi_append'", [request_id])
    assert len(rows) == 1, rows
    return rows[0]


def _check_wire_order(rows: list[dict[str, Any]]) -> None:
    assert [r["seq"] for r in rows] == list(range(len(rows)))
    assert all(a["ts"] <= b["ts"] for a, b in zip(rows, rows[1:], strict=False))  # wire time never goes back
    metas = [json.loads(r["meta"]) for r in rows]
    assert all(isinstance(m["packet"], int) for m in metas)
    # capture order, but for a BidiAppend that overtook an earlier one: it waits for it (as the server does)
    in_place = [m["packet"] for m in metas if "arrived_us" not in m]
    assert in_place == sorted(in_place)
    for r, m in zip(rows, metas, strict=True):
        if "arrived_us" in m:
            assert r["transport"] == "bidi_append" and m["arrived_us"] < int(r["ts"].timestamp() * 1_000_000) + 1
    assert answers_follow_questions(rows)


@pytest.mark.parametrize("transport", ["run", "runsse", "runpoll"])
def test_builtin_client_frames_byte_identical(pcap_sim: SimThread, tmp_path: Path, transport: str) -> None:
    pcap, keylog, turns = _record_python(tmp_path, pcap_sim, ["[scenario:tool_flow] run it"], transport=transport,
                                         workspace=_workspace(tmp_path), execute_locally=True)
    assert turns.errors == [None]
    db = tmp_path / "pcap.duckdb"
    done = import_pcap(pcap, db, keylog)
    assert done.returncode == 0, done.stderr
    (rid,) = turns.request_ids
    s = _session(db, rid)
    meta = json.loads(s["meta"])
    assert (s["source"], s["transport"], s["status"]) == ("import:pcap", transport, "complete")
    assert (meta["order"], meta["timing"], meta["keylog"]) == ("time", "wire", True)
    rows = frames_of(db, s["session_id"])
    got = agent_messages(rows)
    for direction in ("client", "server"):
        assert got[direction] == [e.data for e in turns.frame_log if e.direction == direction], direction
    _check_wire_order(rows)
    # a packet passes the capture before the client reads it
    received = [e.ts_us for e in turns.frame_log if e.direction == "server"]
    captured = [r for r in rows if r["direction"] == "server" and is_agent_message(r)]
    assert all(int(r["ts"].timestamp() * 1_000_000) <= t + 1 for r, t in zip(captured, received, strict=True))
    if transport != "run":
        # the appends the client sent, in append_seqno order
        appends = [r for r in rows if r["transport"] == "bidi_append" and r["direction"] == "client"]
        assert [r["append_seqno"] for r in appends] == list(range(len(appends)))
        # the client may close while its last heartbeat append waits for an answer, and a heartbeat that
        # crosses the run's end is refused (not_found: no live stream), which the client logs and the
        # import keeps as that append's answer; nothing else goes unanswered or is refused
        unanswered = [r for r in appends if unanswered_append(r)]
        assert all(r["kind"] == "client_heartbeat" for r in unanswered), [r["kind"] for r in unanswered]
        answered = [(r, json.loads(r["meta"])) for r in appends if not unanswered_append(r)]
        refused = [r for r, fm in answered if fm["http_status"] != 200]
        assert all(r["kind"] == "client_heartbeat" for r in refused), [r["kind"] for r in refused]
        answers = [r for r in rows if r["transport"] == "bidi_append" and r["direction"] == "server"]
        assert sorted(r["append_seqno"] for r in answers) == [r["append_seqno"] for r in refused], answers
        for _, fm in answered:
            assert fm["content_type"] == "application/proto"
            assert fm["request_headers"]["authorization"].startswith("Bearer [redacted sha256:")
    headers = dict(meta["request_headers"])
    assert headers["authorization"].startswith("Bearer [redacted sha256:") and s["auth_hash"]


@pytest.mark.parametrize(("transport", "via", "framing"), [("run", "flag", "connect"), ("runsse", "env", "connect"),
                                                         ("runsse", "flag", "grpc-web")])
def test_node_client_frames_byte_identical(pcap_sim: SimThread, tmp_path: Path, transport: str, via: str,
                                           framing: str) -> None:
    keylog, pcap, log = tmp_path / "keys.log", tmp_path / "node.pcap", tmp_path / "node.ndjson"
    with Tcpdump(pcap, pcap_sim.port):
        summary = node_turn(pcap_sim.url, pcap_sim.cert_path, log, keylog, transport=transport,  # type: ignore[arg-type]
                            prompt="[scenario:tool_flow] go", via=via, extra=("--framing", framing))
    # a heartbeat append sent as the run ended finds no stream left (404): real, and not the turn's fault
    assert summary["turn_ended"] and (summary["error"] is None or "answered HTTP 404" in summary["error"]), summary
    db = tmp_path / "pcap.duckdb"
    done = import_pcap(pcap, db, keylog)
    assert done.returncode == 0, done.stderr
    s = _session(db, summary["request_id"])
    assert s["status"] == "complete" and s["transport"] == transport
    rows = frames_of(db, s["session_id"])
    logged = node_log(log)
    for direction in ("client", "server"):  # an append's HTTP refusal is a fact of the exchange, not a logged frame
        mine = [(r["transport"], bytes(r["payload"]).hex()) for r in rows
                if r["direction"] == direction and r["kind"] != "http_error"]
        theirs = [(e["transport"], e["hex"]) for e in logged if e["direction"] == direction]
        assert mine == theirs, direction
    _check_wire_order(rows)
    if framing == "grpc-web":  # each append answered by an empty message and a 0x80 trailer, as live capture keeps it
        appends = [json.loads(r["meta"]) for r in rows if r["transport"] == "bidi_append"]
        assert appends and all(m["grpc_status"] == 0 and m["http_status"] == 200 for m in appends)


async def _echo_args_text(ev: ExecRequest) -> str:
    text = ev.call.args_text if ev.call is not None else json.dumps(ev.args)
    return f"task tool received: {text}"


FAULTY = {
    "heartbeat_loop": (["[scenario:stream_close_stall] run echo"], {"faults": ["no_stream_close"],
                                                                    "heartbeat_budget": 8, "execute_locally": True}),
    "kv_only_response": (["[scenario:kv_only_on_reuse] run echo", "[scenario:kv_only_on_reuse] go on"],
                         {"faults": ["reuse_session"], "heartbeat_budget": 8, "execute_locally": True}),
    "args_cumulative_snapshots": (["[scenario:mcp_large_args] dispatch"],
                                  {"faults": ["naive_args_concat"], "heartbeat_budget": 8, "execute_locally": False,
                                   "on_exec": _echo_args_text}),
}


@pytest.mark.parametrize("code", list(FAULTY))
def test_faulty_runs_give_the_findings_of_the_live_recording(pcap_sim: SimThread, tmp_path: Path, code: str) -> None:
    prompts, kw = FAULTY[code]
    live = tmp_path / "client.duckdb"
    store = Store(live)
    try:
        pcap, keylog, turns = _record_python(tmp_path, pcap_sim, prompts, record_to=store,
                                             workspace=_workspace(tmp_path), heartbeat_interval=0.05, **kw)
    finally:
        store.close()
    db = tmp_path / "pcap.duckdb"
    done = import_pcap(pcap, db, keylog)
    assert done.returncode == 0, done.stderr
    sessions = {rid: _session(db, rid)["session_id"] for rid in turns.request_ids}
    got: dict[str, Counter[bytes]] = {"client": Counter(), "server": Counter()}
    for sid in sessions.values():
        rows = frames_of(db, sid)
        _check_wire_order(rows)
        for direction, messages in agent_messages(rows).items():
            got[direction].update(messages)
    for direction in ("client", "server"):  # every message of every run, none twice, none invented
        assert got[direction] == Counter(e.data for e in turns.frame_log if e.direction == direction), direction
    results = {}
    for path in (live, db):
        st = Store(path)
        try:
            results[path] = analyze(st)
        finally:
            st.close()
    for rid, sid in sessions.items():
        assert sorted({f.code for f in results[db][sid].findings}) == sorted({f.code for f in results[live][rid].findings})
    live_codes = sorted({f.code for r in results[live].values() for f in r.findings})
    assert code in live_codes


def test_keys_missing_for_some_connections(pcap_sim: SimThread, tmp_path: Path) -> None:
    """The built-in client's keys are given, the Node client's are not: its connections (server name
    from the ClientHello) are reported as undecryptable, exit 1 with the count, nothing invented."""
    keys, node_keys, pcap = tmp_path / "keys.log", tmp_path / "node-keys.log", tmp_path / "mixed.pcap"
    ctx = keylog_context(pcap_sim.cert_path or "", keys, ALPN["run"])
    with Tcpdump(pcap, pcap_sim.port):
        turns = asyncio.run(python_turns(pcap_sim.url, ctx, ["[scenario:text] hi"]))
        summary = node_turn(pcap_sim.url.replace("127.0.0.1", "localhost"), pcap_sim.cert_path,  # type: ignore[arg-type]
                            tmp_path / "node.ndjson", node_keys, transport="runsse", prompt="[scenario:text] hi")
    assert summary["turn_ended"], summary
    hidden = packets_matching(pcap, 'tls.handshake.extensions_server_name == "localhost"')
    assert hidden >= 2  # the RunSSE stream and its BidiAppends
    db = tmp_path / "pcap.duckdb"
    done = import_pcap(pcap, db, keys)
    assert done.returncode == 1, done.stderr
    assert f"{hidden} TLS connections could not be decrypted" in done.stderr
    assert f"localhost ({hidden})" in done.stderr and str(keys) in done.stderr
    assert done.stdout.startswith(f"imported {pcap}: 1 session,") and f"{hidden} TLS connections undecryptable" in done.stdout
    assert [r["request_id"] for r in query_rows(db, "SELECT request_id FROM sessions")] == turns.request_ids

    bare = tmp_path / "bare.duckdb"
    done = import_pcap(pcap, bare, None)
    assert done.returncode == 1
    assert f"{hidden + 1} TLS connections could not be decrypted" in done.stderr and "no --keylog given" in done.stderr
    assert query_rows(bare, "SELECT count(*) AS n FROM sessions") == [{"n": 0}]
    assert query_rows(bare, "SELECT count(*) AS n FROM frames") == [{"n": 0}]


@pytest.fixture(scope="module")
def pcap_full(pcap_sim: SimThread, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Any]:
    """A built-in client's h2 session with many frames, captured whole."""
    out = tmp_path_factory.mktemp("pcap-full")
    return _record_python(out, pcap_sim, ["[scenario:tool_flow] run it"], workspace=_workspace(out),
                          execute_locally=True)


def test_reimport_adds_nothing(pcap_full: tuple[Path, Path, Any], tmp_path: Path) -> None:
    pcap, keylog, _turns = pcap_full
    db = tmp_path / "pcap.duckdb"
    first = import_pcap(pcap, db, keylog)
    assert first.returncode == 0, first.stderr
    before = query_rows(db, "SELECT session_id, seq, payload, ts, source_key FROM frames ORDER BY session_id, seq")
    copy = tmp_path / "renamed.pcap"
    shutil.copyfile(pcap, copy)
    for again in (pcap, copy):
        done = import_pcap(again, db, keylog)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"skipped {again}: already imported (1 session, {len(before)} frames)"), done.stdout
    assert query_rows(db, "SELECT session_id, seq, payload, ts, source_key FROM frames ORDER BY session_id, seq") == before
    assert all(r["source_key"].startswith("pcap:") for r in before)


def _editcap(src: Path, dst: Path, last_packet: int) -> Path:
    subprocess.run(["editcap", "-r", str(src), str(dst), f"1-{last_packet}"], check=True, capture_output=True)
    return dst


def test_capture_cut_mid_stream(pcap_full: tuple[Path, Path, Any], tmp_path: Path) -> None:
    pcap, keylog, turns = pcap_full
    full_db = tmp_path / "full.duckdb"
    assert import_pcap(pcap, full_db, keylog).returncode == 0
    (rid,) = turns.request_ids
    sid = _session(full_db, rid)["session_id"]
    full = frames_of(full_db, sid)
    middle = next(r for r in full[len(full) // 2:] if r["direction"] == "server")
    cut_at = json.loads(middle["meta"])["packet"]
    expected = [r for r in full if json.loads(r["meta"])["packet"] <= cut_at]

    cut = _editcap(pcap, tmp_path / "cut.pcap", cut_at)
    db = tmp_path / "cut.duckdb"
    done = import_pcap(cut, db, keylog)
    assert done.returncode == 0, done.stderr
    assert "1 exchange cut off by the end of the capture" in done.stdout
    s = _session(db, rid)
    assert s["status"] == "incomplete" and "the capture ended before this exchange did" in s["error"]
    rows = frames_of(db, s["session_id"])
    whole = [r for r in rows if r["error"] is None]
    assert [(r["direction"], bytes(r["payload"])) for r in whole] == \
        [(r["direction"], bytes(r["payload"])) for r in expected]
    assert all("truncated" in (r["error"] or "") for r in rows[len(whole):])  # a frame begun, kept with its error

    # the whole capture later: the session is completed, frame for frame as a fresh import
    done = import_pcap(pcap, db, keylog)
    assert done.returncode == 0 and "1 session completed with new frames" in done.stdout, done.stdout
    cols = "seq, direction, kind, payload, ts, source_key"
    assert query_rows(db, f"SELECT {cols} FROM frames ORDER BY seq") == \
        query_rows(full_db, f"SELECT {cols} FROM frames ORDER BY seq")
    assert _session(db, rid)["status"] == "complete"


def _without_packets(row: dict[str, Any], offset: int) -> dict[str, Any]:
    """A frame row with its packet number as it is in a capture ``offset`` packets shorter."""
    meta = json.loads(row["meta"])
    meta["packet"] -= offset
    return {**row, "meta": meta}


def test_connection_held_twice_the_later_copy_fuller(pcap_full: tuple[Path, Path, Any], pcap_sim: SimThread,
                                                     tmp_path: Path) -> None:
    """Two overlapping captures merged: a connection cut off in the first, then all of it in the
    second. Stored is the whole copy, as importing it alone stores it; a second import adds nothing."""
    pcap, keylog, turns = pcap_full
    whole_db = tmp_path / "whole.duckdb"
    assert import_pcap(pcap, whole_db, keylog).returncode == 0
    sid = _session(whole_db, turns.request_ids[0])["session_id"]
    rows = frames_of(whole_db, sid)
    cut_at = json.loads(next(r for r in rows[len(rows) // 2:] if r["direction"] == "server")["meta"])["packet"]
    cut = _editcap(pcap, tmp_path / "cut.pcap", cut_at)
    later = replayed_later(pcap, tmp_path / "later.pcap", pcap_sim.port, 20001, 60)
    merged = tmp_path / "merged.pcap"
    subprocess.run(["mergecap", "-F", "pcap", "-a", "-w", str(merged), str(cut), str(later)], check=True,
                   capture_output=True)
    alone_db, db = tmp_path / "alone.duckdb", tmp_path / "merged.duckdb"
    assert import_pcap(later, alone_db, keylog).returncode == 0
    alone = frames_of(alone_db, sid)
    assert len(alone) == len(rows) and json.loads(_session(alone_db, turns.request_ids[0])["meta"])[
        "connection"]["client"].endswith(":20001")

    done = import_pcap(merged, db, keylog)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"imported {merged}: 1 session, {len(alone)} frames"), done.stdout
    stored = frames_of(db, sid)
    assert [_without_packets(r, cut_at) for r in stored] == [_without_packets(r, 0) for r in alone]
    cols = "session_id, source, transport, request_id, status, error, frame_count, started_at, ended_at, http_status"
    assert query_rows(db, f"SELECT {cols} FROM sessions") == query_rows(alone_db, f"SELECT {cols} FROM sessions")

    again = import_pcap(merged, db, keylog)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(f"skipped {merged}: already imported (1 session, {len(alone)} frames)"), \
        again.stdout
    assert frames_of(db, sid) == stored


def test_capture_file_cut_inside_a_packet(pcap_full: tuple[Path, Path, Any], tmp_path: Path) -> None:
    pcap, keylog, turns = pcap_full
    data = pcap.read_bytes()
    cut = tmp_path / "cut-bytes.pcap"
    cut.write_bytes(data[: len(data) * 2 // 3])
    db = tmp_path / "cut.duckdb"
    done = import_pcap(cut, db, keylog)
    assert done.returncode == 0, done.stderr
    assert "cut short in the middle of a packet" in done.stderr
    s = _session(db, turns.request_ids[0])
    assert s["status"] == "incomplete" and s["frame_count"] > 0


def test_bad_input_is_named(pcap_full: tuple[Path, Path, Any], tmp_path: Path) -> None:
    pcap, keylog, _turns = pcap_full
    db = tmp_path / "x.duckdb"
    done = import_pcap(pcap, db, tmp_path / "nope.log")
    assert done.returncode == 2 and f"--keylog {tmp_path / 'nope.log'}: cannot read the key log" in done.stderr
    junk = tmp_path / "junk.pcap"
    junk.write_bytes(b"\xd4\xc3\xb2\xa1\x02\x00\x04\x00" + bytes(range(256)) * 8)  # a header, then garbage
    done = import_pcap(junk, db, keylog)
    assert done.returncode == 2 and f"{junk}: tshark could not read it" in done.stderr, done.stderr
    fake = tmp_path / "fake.pcapng"
    fake.write_bytes(b"\x0a\x0d\x0d\x0a" + bytes(range(256)) * 8)  # no section header
    done = import_pcap(fake, db, keylog, "--format", "pcap")
    assert done.returncode == 2 and f"{fake}: not a packet capture" in done.stderr, done.stderr
    done = import_pcap(fake, db, keylog)
    assert done.returncode == 2 and f"{fake}: not a recognised format" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    # no tshark on PATH: one line naming the package
    done = subprocess.run([str(BIN / "workbench"), "import", str(pcap), "--keylog", str(keylog), "--db", str(db)],
                          capture_output=True, text=True, env={"PATH": str(tmp_path / "empty"), "HOME": str(tmp_path)},
                          timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "workbench import: tshark not found: install the tshark package (Debian/Ubuntu: sudo apt-get install tshark)"]


def test_resets_and_goaway_are_recorded_like_live_capture(pcap_sim: SimThread, tmp_path: Path) -> None:
    """RST_STREAM(CANCEL) from the client before the response ended: ``aborted`` with ``meta.reset``;
    a GOAWAY after a complete turn leaves it ``complete`` and is noted in ``meta.goaway``."""
    keylog, pcap = tmp_path / "keys.log", tmp_path / "h2.pcap"
    cert = pcap_sim.cert_path
    assert cert is not None
    with Tcpdump(pcap, pcap_sim.port):
        cancel = node_turn(pcap_sim.url, cert, tmp_path / "cancel.ndjson", keylog, transport="run",
                           prompt="[scenario:tool_flow] go", extra=("--cancel-after", "3"))
        goaway = node_turn(pcap_sim.url, cert, tmp_path / "goaway.ndjson", keylog, transport="run",
                           prompt="[scenario:goaway_after_turn] go")
    assert cancel["rst_code"] is not None and goaway["turn_ended"], (cancel, goaway)
    db = tmp_path / "pcap.duckdb"
    done = import_pcap(pcap, db, keylog)
    assert done.returncode == 0, done.stderr
    s = _session(db, cancel["request_id"])
    meta = json.loads(s["meta"])
    assert (s["status"], s["error"]) == ("aborted", "stream reset by client (CANCEL)")
    assert meta["reset"] == {"side": "client", "h2_error_code": 8, "code": "CANCEL", "after_response_end": False,
                             "message": "stream reset by client (CANCEL)"}
    rows = frames_of(db, s["session_id"])
    logged = node_log(tmp_path / "cancel.ndjson")
    mine = {d: [bytes(r["payload"]).hex() for r in rows if r["direction"] == d] for d in ("client", "server")}
    theirs = {d: [e["hex"] for e in logged if e["direction"] == d] for d in ("client", "server")}
    assert mine["client"] == theirs["client"]
    # the server's frames already on the wire when the reset went out reached the client's socket too;
    # Node drops what arrives for a stream it has reset, the capture keeps it
    assert mine["server"][:len(theirs["server"])] == theirs["server"] == mine["server"][:3]
    g = _session(db, goaway["request_id"])
    gmeta = json.loads(g["meta"])
    assert g["status"] == "complete" and gmeta["goaway"]["side"] == "server"
    assert gmeta["goaway"]["code"] == "NO_ERROR"
