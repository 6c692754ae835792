"""``workbench.transport.bidi_append``: the write side of RunSSE/RunPoll runs — BidiAppends put
back in ``append_seqno`` order with their faults kept, the run's request_id read from its first
envelope, and RunPoll records as the client parses them. Real protobuf bytes and envelopes."""

from __future__ import annotations

import asyncio
import base64

import pytest

from workbench.schema import pb
from workbench.transport.bidi_append import MAX_HELD, AppendChannel, bidi_request_id, poll_record
from workbench.wire.envelope import FLAG_END_STREAM, Envelope, encode, split_frames


def _drain(ch: AppendChannel) -> list[bytes | None]:
    out: list[bytes | None] = []
    while not ch.queue.empty():
        out.append(ch.queue.get_nowait())
    return out


def test_appends_come_out_in_seqno_order_whatever_order_they_arrive_in() -> None:
    ch = AppendChannel("rid-1")
    ch.append(2, b"c")
    ch.append(1, b"b")
    assert _drain(ch) == []  # 0 has not come: both held
    ch.append(0, b"a")
    ch.append(3, b"d")
    assert _drain(ch) == [b"a", b"b", b"c", b"d"]
    assert ch.faults == [] and ch.held == {} and ch.next_seqno == 4


def test_a_duplicate_is_a_fault_and_not_delivered_twice() -> None:
    ch = AppendChannel("rid-2")
    ch.append(0, b"a")
    ch.append(0, b"a again")     # already delivered
    ch.append(2, b"c")
    ch.append(2, b"c again")     # already held
    ch.append(1, b"b")
    assert _drain(ch) == [b"a", b"b", b"c"]
    assert ch.faults == ["duplicate append_seqno 0 for rid-2", "duplicate append_seqno 2 for rid-2"]


def test_a_long_gap_is_a_fault_once_more_than_max_held_wait() -> None:
    ch = AppendChannel("rid-3")
    for n in range(1, MAX_HELD + 1):
        ch.append(n, bytes([n]))
    assert ch.faults == []  # the CLI keeps up to MAX_HELD in flight: not a fault yet
    ch.append(MAX_HELD + 1, b"one more")
    assert ch.faults == [f"append_seqno gap at 0: {MAX_HELD + 1} later appends held"]
    ch.append(0, b"\0")
    assert len(_drain(ch)) == MAX_HELD + 2


def test_close_ends_the_stream_once() -> None:
    ch = AppendChannel("rid-4")
    ch.append(0, b"a")
    ch.close()
    ch.close()
    assert _drain(ch) == [b"a", None]
    assert ch.closed


async def test_a_reader_waiting_on_the_queue_gets_each_append_as_its_gap_fills() -> None:
    ch = AppendChannel("rid-5")
    got: list[bytes | None] = []

    async def reader() -> None:
        while (item := await ch.queue.get()) is not None:
            got.append(item)

    task = asyncio.create_task(reader())
    ch.append(1, b"second")
    ch.append(0, b"first")
    ch.close()
    await asyncio.wait_for(task, 10)
    assert got == [b"first", b"second"]


def _body(*messages: bytes, end: bool = False) -> list[Envelope]:
    raw = b"".join(encode(m) for m in messages) + (encode(b"{}", FLAG_END_STREAM) if end else b"")
    return split_frames(raw)


def test_request_id_of_a_runsse_and_a_runpoll_body() -> None:
    sse = _body(pb.BidiRequestId(request_id="r-sse").SerializeToString(), end=True)
    assert bidi_request_id(sse, "runsse") == ("r-sse", None)
    poll = _body(pb.BidiPollRequest(request_id=pb.BidiRequestId(request_id="r-poll")).SerializeToString())
    assert bidi_request_id(poll, "runpoll") == ("r-poll", None)


_BAD_BODIES = {"no envelope": lambda: [], "only the end": lambda: _body(end=True),
               "an empty id": lambda: _body(pb.BidiRequestId().SerializeToString()),
               "not protobuf": lambda: _body(b"\xff\xff\xff")}


@pytest.mark.parametrize(("transport", "body", "problem"), [
    ("runsse", "no envelope", "runsse request body must be one enveloped BidiRequestId"),
    ("runsse", "only the end", "runsse request body must be one enveloped BidiRequestId"),
    ("runsse", "an empty id", "runsse BidiRequestId has no request_id"),
    ("runpoll", "not protobuf", "runpoll request body is not a BidiPollRequest"),
])
def test_a_body_without_a_usable_request_id_names_the_problem(transport: str, body: str, problem: str) -> None:
    rid, got = bidi_request_id(_BAD_BODIES[body](), transport)
    assert rid is None and got is not None and got.startswith(problem)


def test_poll_records_carry_the_message_base64_and_the_end() -> None:
    msg = pb.AgentServerMessage().SerializeToString() + b"\x0a\x00"
    rec = pb.BidiPollResponse.FromString(poll_record(7, msg, False))
    assert rec.seqno == 7 and rec.data and not rec.eof
    assert base64.b64decode(rec.data) == msg
    last = pb.BidiPollResponse.FromString(poll_record(8, None, True))
    assert last.seqno == 8 and last.data == "" and last.eof
