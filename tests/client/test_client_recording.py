"""What the client records (``record_to``) and logs (``frame_log``): wire frames as the decoder
sees them, end-streams included; appends logged only once the server answered them; end-stream
errors surfaced the same way on every transport."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from support import wait_until_async

from workbench.client.agent import AgentClient
from workbench.client.events import TextDelta
from workbench.decode import fields_of
from workbench.decode.classify import CLIENT_MSG, SERVER_MSG, default_decoder
from workbench.schema import pb
from workbench.sim.runner import running_sim
from workbench.store.reader import open_reader
from workbench.wire.envelope import encode

pytestmark = pytest.mark.slow  # starts subprocesses or servers

TRANSPORTS = ["run", "runsse", "runpoll"]


@pytest.fixture
async def sim():
    async with running_sim(heartbeat_interval=0.05) as s:
        yield s


def _frames(db: Path) -> list[dict[str, Any]]:
    r = open_reader(db)
    try:
        return r.query("SELECT seq, direction, transport, kind, payload, raw, flags, msg_type, append_seqno, "
                       "request_id FROM frames ORDER BY seq").to_pylist()
    finally:
        r.close()


async def test_rate_limit_is_the_same_error_on_every_transport(sim, tmp_path: Path) -> None:
    errors = {}
    for transport in TRANSPORTS:
        db = tmp_path / f"{transport}.duckdb"
        async with AgentClient(sim.url, "t", transport=transport, verify=str(sim.cert_path), record_to=db) as c:
            res = await c.run_turn("[scenario:rate_limit] hi", raise_on_error=False)
        assert res.error is not None, transport
        errors[transport] = res.error
        # the client's own recording keeps the end-stream, its ErrorDetails readable
        ends = [r for r in _frames(db) if r["kind"].startswith("end_stream")]
        assert [r["kind"] for r in ends] == ["end_stream.error"], transport
        e = ends[0]
        tree = fields_of(default_decoder(), e["kind"], e["payload"], e["msg_type"], e["flags"])
        assert tree["error"]["code"] == "resource_exhausted"
        assert tree["error"]["details"][0]["value"]["error"] == "ERROR_RATE_LIMITED_CHANGEABLE"
    assert {t: e.code for t, e in errors.items()} == {t: "resource_exhausted" for t in TRANSPORTS}
    for e in errors.values():
        assert e.details[0]["value"]["error"] == "ERROR_RATE_LIMITED_CHANGEABLE"  # decoded, not just hex


@pytest.mark.parametrize("transport", ["runsse", "runpoll"])
async def test_recording_keeps_the_wrappers(sim, tmp_path: Path, transport: str) -> None:
    db = tmp_path / "c.duckdb"
    async with AgentClient(sim.url, "t", transport=transport, verify=str(sim.cert_path), record_to=db,
                           heartbeat_interval=0.05) as c:
        res = await c.run_turn("[scenario:tool_flow] go", on_exec=_answer)
    assert res.ended
    rows = _frames(db)
    rid = res.request_id
    assert rows[0]["kind"] == ("bidi_request_id" if transport == "runsse" else "bidi_poll_request")
    assert rows[0]["request_id"] == rid
    assert rows[0]["transport"] == transport
    # A heartbeat posted as the run ended may be refused (the server has let the stream go): the
    # refusal is recorded as the server's answer to that append. Nothing else may be refused.
    refused = [r for r in rows if r["transport"] == "bidi_append" and r["direction"] == "server"]
    appends = [r for r in rows if r["transport"] == "bidi_append" and r["direction"] == "client"]
    assert appends
    beats = {r["append_seqno"] for r in appends if r["kind"] == "client_heartbeat"}
    assert all(r["kind"] == "http_error" and r["append_seqno"] in beats for r in refused), refused
    assert [r["append_seqno"] for r in appends] == list(range(len(appends)))
    assert {r["request_id"] for r in appends} == {rid}
    for r in appends:  # the BidiAppendRequest as sent, the agent message inside it
        outer = pb.BidiAppendRequest.FromString(r["raw"])
        assert bytes.fromhex(outer.data) == r["payload"]
        assert outer.append_seqno == r["append_seqno"]
    assert appends[0]["kind"] == "run_request"
    last = [r for r in rows if r not in refused][-1]
    assert (last["kind"], last["direction"]) == ("end_stream", "server")
    if transport == "runpoll":
        polls = [r["append_seqno"] for r in rows if r["direction"] == "server" and r["transport"] == "runpoll"
                 and not r["kind"].startswith("end_stream")]
        assert polls == list(range(len(polls)))
    # agent messages in the recording are exactly the frame log's, per direction
    wrappers = {"bidi_request_id", "bidi_poll_request", "end_stream", "end_stream.error"}
    for direction in ("client", "server"):
        stored = [r["payload"] for r in rows if r["direction"] == direction and r["kind"] not in wrappers
                  and not (r["kind"] == "empty" and not r["payload"]) and r not in refused]
        assert stored == [e.data for e in c.frame_log if e.direction == direction]
    assert [r["seq"] for r in rows] == list(range(len(rows)))


async def _answer(req: Any) -> str:
    return "done"


# --- frame_log lists only appends the server answered ----------------------------------------


class AppendServer:
    """Plain HTTP/1.1 on loopback: RunSSE sends one text delta once the run request arrived and
    stays open; BidiAppend seqno < ``prompt_until`` is answered at once, later ones after
    ``delay`` seconds, or never when ``delay`` is None."""

    def __init__(self, prompt_until: int, delay: float | None) -> None:
        self.prompt_until = prompt_until
        self.delay = delay
        self.received: dict[int, bytes] = {}
        self.answered: list[int] = []
        self.got_first = asyncio.Event()
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        for w in self.writers:
            w.close()

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                length = next((int(v) for k, _, v in (ln.partition(": ") for ln in lines[1:])
                               if k.lower() == "content-length"), 0)
                body = await reader.readexactly(length)
                if path.endswith("/RunSSE"):
                    await self._runsse(reader, writer)
                    return
                req = pb.BidiAppendRequest.FromString(body)
                self.received[req.append_seqno] = bytes.fromhex(req.data)
                if req.append_seqno == 0:
                    self.got_first.set()
                if req.append_seqno >= self.prompt_until:
                    if self.delay is None:
                        await reader.read()  # never answered: wait for the client to hang up
                        return
                    await asyncio.sleep(self.delay)
                self.answered.append(req.append_seqno)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/proto\r\ncontent-length: 0\r\n\r\n")
                await writer.drain()

    async def _runsse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/connect+proto\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")
        await self.got_first.wait()
        msg = pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(text_delta=pb.TextDelta(text="hi")))
        env = encode(msg.SerializeToString())
        writer.write(f"{len(env):x}\r\n".encode() + env + b"\r\n")
        await writer.drain()
        await reader.read()  # open until the client closes it


@pytest.mark.parametrize("delay", [None, 0.3], ids=["never_answered", "answered_while_closing"])
async def test_frame_log_lists_only_answered_appends(delay: float | None) -> None:
    srv = AppendServer(prompt_until=2, delay=delay)
    url = await srv.start()
    try:
        async with AgentClient(url, "t", transport="runsse", verify=False, heartbeat_interval=0.02) as c:
            turn = c.stream_turn("hello")
            assert isinstance(await anext(turn), TextDelta)
            # heartbeats 1 (answered) and 2 (held) are out; leave the turn with 2 in flight
            await wait_until_async(lambda: 2 in srv.received, what="a held append")
            await turn.aclose()
            log = [e for e in c.frame_log if e.direction == "client"]
    finally:
        await srv.close()
    sent = [srv.received[s] for s in sorted(srv.answered)]
    assert [e.data for e in log] == sent
    kinds = [default_decoder().classify_agent(e.data, CLIENT_MSG).kind for e in log]
    assert kinds[0] == "run_request"
    assert set(kinds[1:]) == {"client_heartbeat"}
    assert [e.ts_us for e in c.frame_log] == sorted(e.ts_us for e in c.frame_log)
    if delay is None:
        assert len(srv.received) > len(log)  # the held ones went out but were never confirmed
    else:
        assert 2 in srv.answered
        assert len(log) == len(srv.received)  # the close waited for them
    server = [e for e in c.frame_log if e.direction == "server"]
    assert [default_decoder().classify_agent(e.data, SERVER_MSG).kind for e in server] == [
        "interaction_update.text_delta"]
