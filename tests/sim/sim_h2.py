"""A small real HTTP/2-over-TLS client for the simulator tests (asyncio + ssl + h2, no mocks).

It speaks Run exactly as a Cursor client does: one POST whose request body stays open while the
response streams, envelopes both ways.
"""

from __future__ import annotations

import asyncio
import ssl
import uuid
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings

from workbench.decode import default_decoder, fields_of
from workbench.decode.classify import Frame
from workbench.schema import pb
from workbench.wire.envelope import encode

RUN = "/agent.v1.AgentService/Run"


class H2Stream:
    def __init__(self, client: H2Client, stream_id: int) -> None:
        self.client = client
        self.stream_id = stream_id
        self.headers: dict[str, str] = {}
        self.trailers: dict[str, str] = {}  # HTTP/2 trailers (gRPC's status)
        self.headers_ready = asyncio.Event()
        self.chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.reset = False
        self.reset_code: int | None = None  # the error code of the server's RST_STREAM

    async def send(self, data: bytes, end: bool = False) -> None:
        c = self.client
        c.conn.send_data(self.stream_id, data, end_stream=end)
        await c.flush()

    async def end(self) -> None:
        self.client.conn.end_stream(self.stream_id)
        await self.client.flush()

    async def read(self, timeout: float = 30) -> bytes | None:
        return await asyncio.wait_for(self.chunks.get(), timeout)

    async def read_all(self, timeout: float = 30) -> bytes:
        out = bytearray()
        while (c := await self.read(timeout)) is not None:
            out += c
        return bytes(out)


class H2Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, authority: str) -> None:
        self.reader = reader
        self.writer = writer
        self.authority = authority
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.streams: dict[int, H2Stream] = {}
        self.alpn: str | None = None
        self.goaway: int | None = None  # GOAWAY error code once the server sent one
        self._reader_task: asyncio.Task[None] | None = None

    @classmethod
    async def connect(cls, url: str, cafile: Path | str | None) -> H2Client:
        hostport = url.split("://", 1)[1]
        host, port = hostport.rsplit(":", 1)
        ctx: ssl.SSLContext | None = None
        if url.startswith("https"):
            ctx = ssl.create_default_context(cafile=str(cafile))
            ctx.set_alpn_protocols(["h2"])
        reader, writer = await asyncio.open_connection(host, int(port), ssl=ctx)
        self = cls(reader, writer, hostport)
        if ctx is not None:
            self.alpn = writer.get_extra_info("ssl_object").selected_alpn_protocol()
        self.conn.initiate_connection()
        self.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 24,
                                   h2.settings.SettingCodes.MAX_FRAME_SIZE: (1 << 24) - 1})
        self.conn.increment_flow_control_window(1 << 24)
        await self.flush()
        self._reader_task = asyncio.get_running_loop().create_task(self._read_loop())
        return self

    async def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.writer.write(data)
            await self.writer.drain()

    async def request(self, path: str, headers: dict[str, str], body: bytes | None = None) -> H2Stream:
        sid = self.conn.get_next_available_stream_id()
        stream = self.streams[sid] = H2Stream(self, sid)
        hdrs = [(":method", "POST"), (":scheme", "https"), (":authority", self.authority), (":path", path)]
        hdrs += list(headers.items())
        self.conn.send_headers(sid, hdrs, end_stream=body is not None and not body)
        if body:
            self.conn.send_data(sid, body, end_stream=True)
        await self.flush()
        return stream

    async def _read_loop(self) -> None:
        try:
            while True:
                data = await self.reader.read(1 << 16)
                if not data:
                    break
                for ev in self.conn.receive_data(data):
                    st = self.streams.get(getattr(ev, "stream_id", 0) or 0)
                    if isinstance(ev, h2.events.ResponseReceived) and st:
                        st.headers = {k: v for k, v in ev.headers}
                        st.headers_ready.set()
                    elif isinstance(ev, h2.events.TrailersReceived) and st:
                        st.trailers = {k: v for k, v in ev.headers}
                    elif isinstance(ev, h2.events.DataReceived) and st:
                        self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                        st.chunks.put_nowait(ev.data)
                    elif isinstance(ev, h2.events.StreamEnded) and st:
                        st.chunks.put_nowait(None)
                    elif isinstance(ev, h2.events.StreamReset) and st:
                        st.reset = True
                        st.reset_code = int(ev.error_code)
                        st.chunks.put_nowait(None)
                    elif isinstance(ev, h2.events.ConnectionTerminated):
                        self.goaway = ev.error_code
                await self.flush()
        except (ConnectionError, OSError):
            pass
        finally:
            for st in self.streams.values():
                st.chunks.put_nowait(None)

    async def close(self) -> None:
        if self._reader_task is not None:
            self._reader_task.cancel()
        self.writer.close()


def run_request(text: str, model: str = "claude-4-sonnet", conversation_id: str | None = None,
                state: Any = None, with_state: bool = True, mcp_tools: list[Any] | None = None) -> bytes:
    req = pb.AgentRunRequest(
        action=pb.ConversationAction(user_message_action=pb.UserMessageAction(
            user_message=pb.UserMessage(text=text, message_id=str(uuid.uuid4())))),
        requested_model=pb.RequestedModel(model_id=model),
        conversation_id=conversation_id or str(uuid.uuid4()),
    )
    if with_state:
        req.conversation_state.CopyFrom(state if state is not None else pb.ConversationStateStructure())
    if mcp_tools:
        req.mcp_tools.CopyFrom(pb.McpTools(mcp_tools=mcp_tools))
    return bytes(pb.AgentClientMessage(run_request=req).SerializeToString())


class RunSession:
    """One Run stream: send AgentClientMessages, read classified server frames."""

    def __init__(self, stream: H2Stream) -> None:
        self.stream = stream
        self.decoder = default_decoder()
        self._dec = self.decoder.stream("run", "server")
        self._frames: list[Frame] = []
        self.ended = False
        self.log: list[Frame] = []
        self.allow_unknown_members = False  # True where a scenario sends a oneof case the schema lacks on purpose

    @classmethod
    async def open(cls, client: H2Client, token: str | None = "test-token",
                   extra: dict[str, str] | None = None) -> RunSession:
        headers = {"content-type": "application/connect+proto", "connect-protocol-version": "1",
                   "te": "trailers", "x-request-id": str(uuid.uuid4())}
        if token is not None:
            headers["authorization"] = f"Bearer {token}"
        headers.update(extra or {})
        return cls(await client.request(RUN, headers))

    async def send(self, msg: Any) -> None:
        data = msg if isinstance(msg, bytes) else bytes(msg.SerializeToString())
        await self.stream.send(encode(data))

    async def next(self, timeout: float = 30) -> Frame | None:
        while not self._frames:
            if self.ended:
                return None
            chunk = await self.stream.read(timeout)
            if chunk is None:
                self.ended = True
                self._frames.extend(self._dec.close())
                continue
            self._frames.extend(self._dec.feed(chunk))
        f = self._frames.pop(0)
        self.log.append(f)
        # Everything the simulator sends must decode cleanly with the workbench's own decoder.
        assert f.kind != "malformed", f
        assert f.error is None, f
        assert self.allow_unknown_members or not f.kind[-1].isdigit(), f
        return f

    async def until(self, kind: str, timeout: float = 30, auto_kv: bool = True) -> list[Frame]:
        """Frames up to and including the first of ``kind`` (answering KV requests on the way)."""
        seen: list[Frame] = []
        while True:
            f = await self.next(timeout)
            if f is None:
                raise AssertionError(f"stream ended before {kind}; saw {[x.kind for x in seen]}")
            seen.append(f)
            if auto_kv and f.kind.startswith("kv_server_message"):
                await self.answer_kv(f)
            if f.kind == kind:
                return seen

    async def answer_kv(self, f: Frame, blobs: dict[bytes, bytes] | None = None) -> None:
        msg = pb.AgentServerMessage.FromString(f.payload).kv_server_message
        store = blobs if blobs is not None else _BLOBS
        if f.kind == "kv_server_message.set_blob_args":
            store[bytes(msg.set_blob_args.blob_id)] = bytes(msg.set_blob_args.blob_data)
            res = pb.KvClientMessage(id=msg.id, set_blob_result=pb.SetBlobResult())
        else:
            got = store.get(bytes(msg.get_blob_args.blob_id))
            res = pb.KvClientMessage(id=msg.id, get_blob_result=pb.GetBlobResult())
            if got is not None:
                res.get_blob_result.blob_data = got
        await self.send(pb.AgentClientMessage(kv_client_message=res))


_BLOBS: dict[bytes, bytes] = {}


def server_msg(f: Frame) -> Any:
    return pb.AgentServerMessage.FromString(f.payload)


async def open_run(sim: Any, token: str | None = "test-token", **headers: str) -> tuple[H2Client, RunSession]:
    client = await H2Client.connect(sim.url, sim.cert_path)
    assert client.alpn == "h2"
    return client, await RunSession.open(client, token=token, extra=headers or None)


def error_of(session: RunSession, frame: Any) -> dict[str, Any]:
    assert frame.kind == "end_stream.error", frame
    tree = fields_of(session.decoder, frame.kind, frame.payload, frame.msg_type, frame.flags)
    return tree["error"]


def detail_error(err: dict[str, Any]) -> str:
    return err["details"][0]["value"]["error"]


async def answer_exec(session: RunSession, f: Any, result: Any, close: bool = True) -> None:
    """Answer an exec_server_message frame with ``result`` (an ExecClientMessage field dict)."""
    esm = server_msg(f).exec_server_message
    ecm = pb.ExecClientMessage(id=esm.id, exec_id=esm.exec_id, **result)
    await session.send(pb.AgentClientMessage(exec_client_message=ecm))
    if close:
        await session.send(pb.AgentClientMessage(exec_client_control_message=pb.ExecClientControlMessage(
            stream_close=pb.ExecClientStreamClose(id=esm.id))))


def shell_ok(stdout: str) -> dict[str, Any]:
    return {"shell_result": pb.ShellResult(success=pb.ShellSuccess(command="x", exit_code=0, stdout=stdout))}


async def frames_until_heartbeats(session: RunSession, count: int = 3, timeout: float = 30) -> list[Any]:
    """Frames up to the ``count``-th heartbeat (answering KV on the way): enough to show a parked run."""
    out: list[Any] = []
    beats = 0
    while beats < count:
        f = await session.next(timeout=timeout)
        assert f is not None, f"stream ended after {[x.kind for x in out]}"
        out.append(f)
        beats += f.kind == "interaction_update.heartbeat"
        if f.kind.startswith("kv_server_message"):
            await session.answer_kv(f)
    return out
