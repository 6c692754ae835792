"""The writer's pacing (``workbench.capture.pacing``): it yields the GIL to a busy proxy between
slices of work, and loses, reorders or holds back nothing for it."""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

from workbench.capture.pacing import Pacer
from workbench.capture.writer import CaptureWriter, Chunk, Done, Eof, FlowOpen, Open, WriterConfig
from workbench.schema import pb
from workbench.store import open_reader
from workbench.wire.envelope import encode

API_KEY = "sk-live-MODELKEY-4411"


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s


def _pacer(q: queue.SimpleQueue[int], clock: _Clock, backlog: int = 1000) -> Pacer:
    return Pacer(q, slice_s=0.001, pause_s=0.0001, backlog=backlog, busy_s=0.01, clock=clock, sleep=clock.sleep)


def test_pacer_yields_only_while_the_proxy_hands_over_events() -> None:
    clock = _Clock()
    q: queue.SimpleQueue[int] = queue.SimpleQueue()
    for i in range(100):
        q.put(i)
    p = _pacer(q, clock)
    p.begin()
    # the writer takes two events in a slice's time while the proxy puts three more: busy → a pause
    q.get_nowait()
    clock.t += 0.0006
    p.step()
    q.get_nowait()
    for i in range(3):
        q.put(i)
    clock.t += 0.0006
    p.step()
    assert p.pauses == 1 and clock.slept == [0.0001]
    # slices with nothing put: still busy for 10 ms after the last hand-off seen, then full speed
    for _ in range(30):
        q.get_nowait()
        clock.t += 0.0011
        p.step()
    assert 1 < p.pauses < 12
    paused = p.pauses
    for _ in range(5):
        q.put(0)
        q.get_nowait()
        clock.t += 0.0011
        p.step()
    assert p.pauses == paused + 5  # busy again as soon as events come in


def test_pacer_does_not_pause_within_a_slice_or_beyond_the_backlog() -> None:
    clock = _Clock()
    q: queue.SimpleQueue[int] = queue.SimpleQueue()
    p = _pacer(q, clock, backlog=100)
    p.begin()
    for _ in range(5):  # short events within one slice: no clock read gives a pause
        q.put(0)
        q.get_nowait()
        clock.t += 0.0001
        p.step()
    assert p.pauses == 0
    for i in range(200):  # a backlog beyond the bound: the writer keeps up instead of yielding
        q.put(i)
    for _ in range(20):
        q.put(0)
        q.get_nowait()
        clock.t += 0.0011
        p.step()
    assert p.pauses == 0


def _text(i: int) -> bytes:
    return pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(
        text_delta=pb.TextDelta(text=f"{i} " + "x" * 60))).SerializeToString()


def test_a_burst_is_recorded_whole_in_order_and_redacted_while_the_writer_yields(tmp_path: Path) -> None:
    """A proxy handing over a flood of chunks while the writer drains: the writer pauses for it,
    and every frame is still committed, in order, with the secrets redacted."""
    n = 20_000
    w = CaptureWriter(WriterConfig(db_path=str(tmp_path / "cap.duckdb"), flush_interval=0.05, live=False))
    w.start()
    put = w.queue.put
    put(Open(FlowOpen(key="f1", transport="run", streaming=True, host="127.0.0.1",
                      path="/agent.v1.AgentService/Run", ts_us=time.time_ns() // 1000, request_id="burst",
                      meta={"request_headers": [["authorization", "Bearer <redacted>"]]})))
    run = pb.AgentClientMessage(run_request=pb.AgentRunRequest(
        conversation_id="c", requested_model=pb.RequestedModel(
            model_id="m", api_key_credentials=pb.ApiKeyCredentials(api_key=API_KEY)))).SerializeToString()
    put(Chunk("f1", "client", time.time_ns() // 1000, encode(run)))

    def proxy() -> None:
        # envelopes cut at odd places, as DATA frames cut them, handed over while the writer works
        body = b"".join(encode(_text(i)) for i in range(n))
        for i in range(0, len(body), 1337):
            put(Chunk("f1", "server", time.time_ns() // 1000, body[i:i + 1337]))
            if not i % (1337 * 8):
                time.sleep(0.002)  # in bursts, like a proxy between socket reads
        put(Eof("f1", "server", time.time_ns() // 1000))
        put(Eof("f1", "client", time.time_ns() // 1000))
        put(Done("f1", time.time_ns() // 1000, None, {}))

    t = threading.Thread(target=proxy)
    t.start()
    t.join()
    w.stop()

    assert w.pacer.pauses > 0, "the writer never yielded while the proxy was handing over chunks"
    assert w.lost == 0
    r = open_reader(tmp_path / "cap.duckdb")
    rows = r.query("SELECT seq, direction, payload FROM frames WHERE session_id = 'burst' ORDER BY seq").to_pylist()
    r.close()
    assert [x["seq"] for x in rows] == list(range(n + 1))
    assert rows[0]["direction"] == "client"
    assert [x["payload"] for x in rows[1:]] == [_text(i) for i in range(n)]
    assert API_KEY.encode() not in (tmp_path / "cap.duckdb").read_bytes()
