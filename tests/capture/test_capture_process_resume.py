"""The confirmation protocol of the writer process, where timing cannot reach it (real DuckDB files).

A child can die after its commit but before its confirmation reached mitmdump. Its successor then
asks the database whether that commit happened (the commit's last frame is stored) and goes on from
the checkpoint taken before it, or from the last confirmed one: either way the database holds
exactly what the checkpoint's commit held, so the batches replayed after it record nothing twice.
The kill -9 tests (``test_capture_process*.py``) cover the rest with real processes.
"""

from __future__ import annotations

import pickle
import threading
import uuid
from pathlib import Path
from typing import Any

from flood_rig import text_frame
from support import wait_until

from workbench.capture import resume
from workbench.capture.flows import Batch, Chunk, Done, Eof, Flow, FlowOpen, Open
from workbench.capture.pacing import NoPacing
from workbench.capture.spool import FrameRecord, Spool, merge_spools
from workbench.capture.writer import CaptureWriter, WriterConfig
from workbench.decode.classify import Frame
from workbench.store import open_reader
from workbench.store.db import SessionInfo, Store
from workbench.wire.envelope import encode

NS = str(uuid.uuid4())


class Checkpoints:
    """A ``CommitListener`` keeping the checkpoint taken before each commit, by batch."""

    def __init__(self) -> None:
        self.writer: CaptureWriter | None = None
        self.taken: dict[int, bytes] = {}
        self.committed_mark = -1

    def committing(self, mark: int) -> None:
        assert self.writer is not None
        self.taken.setdefault(mark, resume.take(self.writer))  # the commit of that batch's frames

    def committed(self, mark: int) -> None:
        self.committed_mark = mark


def _config(db: Path) -> WriterConfig:
    return WriterConfig(str(db), flush_interval=0.02, live=False, session_ns=NS)


def test_a_successor_goes_on_from_the_checkpoint_whose_commit_the_database_holds(tmp_path: Path) -> None:
    db = tmp_path / "resume.duckdb"
    stream = b"".join(encode(text_frame(i, 50)) for i in range(6))
    cut = len(stream) // 2 + 3  # inside an envelope: the first batch leaves a partial frame behind
    listener = Checkpoints()
    first = CaptureWriter(_config(db), pacer=NoPacing(), commits=listener)
    listener.writer = first
    first.start()
    first.queue.put(Batch(1, [Open(FlowOpen("k", "run", True, "api2.cursor.sh", "/agent.v1.AgentService/Run", 1,
                                            request_id="rid-resume")),
                              Chunk("k", "server", 2, stream[:cut])]))
    wait_until(lambda: listener.committed_mark >= 1, timeout=30, what="the first batch's commit")
    first.queue.put(Batch(2, [Chunk("k", "server", 3, stream[cut:]), Eof("k", "server", 4), Done("k", 5, None, {})]))
    wait_until(lambda: listener.committed_mark >= 2, timeout=30, what="the second batch's commit")
    first.stop()
    one, two = pickle.loads(listener.taken[1]), pickle.loads(listener.taken[2])
    assert one.mark == 1 and two.mark == 2
    # the checkpoint of batch 1 holds the open flow, its decoder's partial frame as bytes
    [(flow, held, _)] = one.flows
    assert flow.session_id == "rid-resume" and held["server"] == stream[cut - len(held["server"]):cut]
    assert 0 < len(held["server"]) < len(encode(text_frame(0, 50)))
    assert two.probe is not None and two.probe[0] == "rid-resume"

    successor = CaptureWriter(_config(db), pacer=NoPacing())
    successor.sink.open(settle_open=False)
    try:
        # the commit of batch 2 is in the database: go on after batch 2
        assert resume.choose(successor, listener.taken[1], listener.taken[2]).mark == 2
        # a commit that did not happen (its last frame is not stored): go on after batch 1
        unborn = resume.Checkpoint(mark=3, probe=("rid-resume", two.probe[1] + 1))
        assert resume.choose(successor, listener.taken[2], pickle.dumps(unborn)).mark == 2
        # a commit with no frame cannot be told apart, and needs not be: the confirmed one
        assert resume.choose(successor, listener.taken[1], pickle.dumps(resume.Checkpoint(mark=3))).mark == 1
        assert resume.choose(successor, None, None).mark == 0

        # going on from batch 1: the partial frame and the rest of the stream make the frames whole
        resume.restore(successor, one)
        assert successor.mark == 1 and successor.flows["k"].session_id == "rid-resume"
        frames = successor.flows["k"].decoders["server"].feed(stream[cut:])
        assert [f.payload for f in frames] == [text_frame(i, 50) for i in range(6)][-len(frames):]
    finally:
        successor.sink.close()
    stored = open_reader(db).query("SELECT seq, payload FROM frames WHERE session_id = 'rid-resume' "
                                   "AND kind <> 'end_stream' ORDER BY seq").to_pylist()
    assert [r["payload"] for r in stored] == [text_frame(i, 50) for i in range(6)]


def test_a_frame_spooled_twice_by_a_restarted_writer_is_merged_once(tmp_path: Path, monkeypatch: Any) -> None:
    """Without a database, a writer process that died after its spool write but before confirming
    it is replayed from the checkpoint before: the same frames, same numbers, spooled again. The
    merge stores each once (two records at one (session, seq) used to fail the whole merge)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    db = tmp_path / "twice.duckdb"
    frames = [Frame("text_delta", f"frame {n}", text_frame(n, 20)) for n in range(4)]
    records = [FrameRecord("s", n, 1_000 + n, "server", "run", None, f) for n, f in enumerate(frames)]
    spool = Spool(db)
    spool.write([SessionInfo("s", status="open")], records[:3])   # the dead writer's
    spool.write([SessionInfo("s", status="complete")], records[1:])  # its successor's, from batch 1 on
    spool.close()
    with Store(db) as store:
        assert merge_spools(store, db) == 4
        rows = store.query("SELECT seq, payload FROM frames ORDER BY seq").to_pylist()
    assert rows == [{"seq": n, "payload": text_frame(n, 20)} for n in range(4)]


class _Unpicklable:
    """A stream decoder with state that cannot cross to another process (a lock, a hash object)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def feed(self, chunk: bytes) -> list[Frame]:
        return []

    def close(self) -> list[Frame]:
        return []


def test_a_body_whose_decoder_cannot_be_handed_over_is_counted_lost_not_garbled(tmp_path: Path) -> None:
    db = tmp_path / "lost.duckdb"
    dying = CaptureWriter(_config(db), pacer=NoPacing())
    dying.sink.open()
    fo = FlowOpen("k", "run", True, "api2.cursor.sh", "/agent.v1.AgentService/Run", 1, request_id="rid-lost")
    dying.flows["k"] = Flow(fo, session_id="rid-lost", decoders={"server": _Unpicklable()})  # type: ignore[dict-item]
    cp = resume.take(dying)
    dying.sink.close()
    [(_, held, _)] = pickle.loads(cp).flows
    assert held == {"server": None}

    successor = CaptureWriter(_config(db), pacer=NoPacing())
    successor.sink.open(settle_open=False)
    try:
        resume.restore(successor, pickle.loads(cp))
        rest = successor.flows["k"].decoders["server"]
        assert rest.feed(b"the rest of the body") == [] and rest.feed(b"") == []
        assert successor.lost == 1  # one chunk, counted
        # and the next checkpoint still crosses (the stand-in is not pickled)
        assert pickle.loads(resume.take(successor)).flows[0][1] == {"server": None}
    finally:
        successor.sink.close()
