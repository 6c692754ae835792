"""A gRPC-Web ("mode D") agent client for tests, written from the wire description alone.

It behaves like the Bun/TypeScript OpenCode↔Cursor proxy of the seed notes
(tool-calling-investigation-dec08 / -dec10): HTTP/1.1 only; RunSSE and every BidiAppend sent as
``application/grpc-web+proto`` with 5-byte envelopes; the end of a response read from the gRPC-Web
trailer frame (flag 0x80, ``grpc-status`` / ``grpc-message``) while Connect end-stream frames (0x02)
are ignored; models listed with ``/aiserver.v1.AiService/GetUsableModels`` as Connect JSON; and
stateless tool calls: it hands a tool call out and abandons the run, and the ``role: tool``
follow-up is a fresh run with a new ``conversation_id`` and the history flattened into the prompt.

Nothing of workbench's own client, transport or framing code is used: HTTP/1.1 is written on raw
asyncio streams + ``ssl`` here, envelopes and trailers are built and parsed here. Only the message
classes come from ``workbench.schema.pb`` (the protocol's field numbers). So when this client and
``workbench sim`` (or a capture in between) agree, that is evidence, not construction.

Usable from tests (``ModeDClient``) and from a shell::

    python tests/clients/grpcweb_mode_d_client.py URL --cafile CERT --token T "[scenario:tool_flow] hi"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import struct
import sys
import urllib.parse
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.schema import pb

GRPC_WEB = "application/grpc-web+proto"
RUNSSE = "/agent.v1.AgentService/RunSSE"
APPEND = "/aiserver.v1.BidiService/BidiAppend"
AI_MODELS = "/aiserver.v1.AiService/GetUsableModels"
CLIENT_VERSION = "cli-2025.11.25-d5b3271"  # what the seed proxy claims to be


# --------------------------------------------------------------------------------------------
# gRPC-Web framing
# --------------------------------------------------------------------------------------------


def envelope(payload: bytes, flags: int = 0) -> bytes:
    return struct.pack(">BI", flags, len(payload)) + payload


class Frames:
    """Incremental envelope splitter: ``feed(bytes)`` → [(flags, payload)]."""

    def __init__(self) -> None:
        self.buf = b""

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self.buf += data
        out = []
        while len(self.buf) >= 5:
            flags, length = struct.unpack(">BI", self.buf[:5])
            if len(self.buf) < 5 + length:
                break
            out.append((flags, self.buf[5:5 + length]))
            self.buf = self.buf[5 + length:]
        return out


def parse_trailer(payload: bytes) -> dict[str, str]:
    out = {}
    for line in payload.decode("ascii", "replace").split("\r\n"):
        if ":" in line:
            k, v = line.split(":", 1)
            out[k.strip().lower()] = v.strip()
    if "grpc-message" in out:
        out["grpc-message"] = urllib.parse.unquote(out["grpc-message"])
    return out


# --------------------------------------------------------------------------------------------
# HTTP/1.1 over TLS, one request per connection
# --------------------------------------------------------------------------------------------


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    async def chunks(self) -> Any:
        """The body as it arrives (chunked, content-length or until EOF)."""
        te = self.headers.get("transfer-encoding", "").lower()
        if "chunked" in te:
            while True:
                size_line = await self.reader.readuntil(b"\r\n")
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while (await self.reader.readuntil(b"\r\n")) != b"\r\n":
                        pass  # trailers of the chunked encoding (none expected)
                    return
                data = await self.reader.readexactly(size)
                await self.reader.readexactly(2)
                yield data
        elif "content-length" in self.headers:
            left = int(self.headers["content-length"])
            while left:
                data = await self.reader.read(min(left, 65536))
                if not data:
                    return
                left -= len(data)
                yield data
        else:
            while data := await self.reader.read(65536):
                yield data

    async def body(self) -> bytes:
        return b"".join([c async for c in self.chunks()])

    def close(self) -> None:
        self.writer.close()


class Http1:
    """``proxy``: an HTTP proxy URL to tunnel through with CONNECT (as a client honouring
    ``HTTPS_PROXY`` does), TLS to the origin inside the tunnel."""

    def __init__(self, base_url: str, cafile: str | None, proxy: str | None = None) -> None:
        parts = urllib.parse.urlsplit(base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 443
        self.tls: ssl.SSLContext | None = None
        if parts.scheme == "https":
            self.tls = ssl.create_default_context(cafile=cafile)
            self.tls.set_alpn_protocols(["http/1.1"])
        self.proxy = urllib.parse.urlsplit(proxy) if proxy else None

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        hostname = self.host if self.tls else None
        if self.proxy is None:
            return await asyncio.open_connection(self.host, self.port, ssl=self.tls, server_hostname=hostname)
        reader, writer = await asyncio.open_connection(self.proxy.hostname, self.proxy.port or 80)
        target = f"{self.host}:{self.port}"
        writer.write(f"CONNECT {target} HTTP/1.1\r\nhost: {target}\r\n\r\n".encode("latin-1"))
        await writer.drain()
        status = int((await reader.readuntil(b"\r\n")).split()[1])
        while (await reader.readuntil(b"\r\n")) != b"\r\n":
            pass
        if status != 200:
            writer.close()
            raise ConnectionError(f"proxy CONNECT {target} answered {status}")
        if self.tls is not None:
            await writer.start_tls(self.tls, server_hostname=hostname)
        return reader, writer

    async def post(self, path: str, headers: dict[str, str], body: bytes) -> Response:
        reader, writer = await self._connect()
        head = [f"POST {path} HTTP/1.1", f"host: {self.host}:{self.port}", f"content-length: {len(body)}",
                "connection: close", *[f"{k}: {v}" for k, v in headers.items()]]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        await writer.drain()
        status_line = await reader.readuntil(b"\r\n")
        status = int(status_line.split()[1])
        hdrs: dict[str, str] = {}
        while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
            k, _, v = line.decode("latin-1").partition(":")
            hdrs[k.strip().lower()] = v.strip()
        return Response(status, hdrs, reader, writer)


# --------------------------------------------------------------------------------------------
# The client
# --------------------------------------------------------------------------------------------


@dataclass
class ToolCallOut:
    """A tool call handed to the caller (what the proxy turns into an OpenAI tool_call)."""

    openai_id: str
    name: str
    arguments: dict[str, Any]
    exec_kind: str


@dataclass
class TurnResult:
    text: str = ""
    tool_calls: list[ToolCallOut] = field(default_factory=list)
    turn_ended: bool = False
    trailer: dict[str, str] | None = None  # the gRPC-Web trailer frame, when one came
    connect_end_frames: int = 0  # Connect end-stream frames seen (and ignored)
    heartbeats: int = 0
    append_statuses: list[int] = field(default_factory=list)  # HTTP status of every BidiAppend
    append_grpc_status: list[str | None] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)  # what the server sent, in order
    sent: list[str] = field(default_factory=list)  # what this client appended, in order
    abandoned: bool = False
    error: str | None = None  # why the turn stopped early (e.g. a refused BidiAppend)
    request_id: str = ""  # the run's BidiRequestId (x-request-id, every append's request_id)
    conversation_id: str = ""

    @property
    def grpc_status(self) -> str | None:
        return self.trailer.get("grpc-status") if self.trailer else None


class AppendRefused(Exception):
    pass


def shell_output(command: str) -> str:
    return f"ran: {command}\n"


class ModeDClient:
    """``close_policy``: when to send exec_client_control_message.stream_close after results —
    ``streams-only`` (2026 clients: only after a shell stream and after a throw), ``always`` (the
    December 2025 fix), ``never``. ``close_after_heartbeats``: send the stream_closes it held back
    once that many server heartbeats arrived in a row (to leave a strict server's stall).
    ``append_content_type``: ``application/proto`` reproduces the 415 a mode-D client gets when it
    sends its envelope as Connect unary."""

    def __init__(self, base_url: str, token: str, cafile: str | None = None, *,
                 close_policy: str = "streams-only", close_after_heartbeats: int | None = None,
                 append_content_type: str = GRPC_WEB, max_heartbeats: int = 200, proxy: str | None = None) -> None:
        self.http = Http1(base_url, cafile, proxy)
        self.token = token
        self.close_policy = close_policy
        self.close_after_heartbeats = close_after_heartbeats
        self.append_content_type = append_content_type
        self.max_heartbeats = max_heartbeats
        self.blobs: dict[bytes, bytes] = {}

    def _headers(self, request_id: str, content_type: str) -> dict[str, str]:
        return {"content-type": content_type, "authorization": f"Bearer {self.token}",
                "x-cursor-client-version": CLIENT_VERSION, "x-ghost-mode": "false", "x-request-id": request_id}

    async def list_models(self) -> list[str]:
        """The AiService listing as Connect JSON, as the seed proxy asks it."""
        headers = self._headers(str(uuid.uuid4()), "application/json")
        headers["connect-protocol-version"] = "1"
        resp = await self.http.post(AI_MODELS, headers, b'{"customModelIds":[]}')
        body = await resp.body()
        resp.close()
        if resp.status != 200:
            raise RuntimeError(f"GetUsableModels: HTTP {resp.status} {body[:200]!r}")
        return [m["modelId"] for m in json.loads(body)["models"]]

    async def run(self, prompt: str, *, conversation_id: str | None = None, model: str = "default",
                  tools: Sequence[dict[str, Any]] = (), hand_out: bool = True,
                  timeout: float = 60.0) -> TurnResult:
        """One turn. ``hand_out``: a tool exec ends the turn with the call handed to the caller (the
        run is abandoned); otherwise tools are answered here (shell streams the 2026 way)."""
        return await asyncio.wait_for(self._run(prompt, conversation_id or str(uuid.uuid4()), model, tools,
                                                hand_out), timeout)

    async def _run(self, prompt: str, conversation_id: str, model: str, tools: Sequence[dict[str, Any]],
                   hand_out: bool) -> TurnResult:
        request_id = str(uuid.uuid4())
        res = TurnResult(request_id=request_id, conversation_id=conversation_id)
        seqno = 0
        unclosed: list[int] = []
        quiet_beats = 0

        async def append(msg: Any) -> None:
            nonlocal seqno
            req = pb.BidiAppendRequest(data=msg.SerializeToString().hex(),
                                       request_id=pb.BidiRequestId(request_id=request_id), append_seqno=seqno)
            seqno += 1
            res.sent.append(_describe(msg))
            resp = await self.http.post(APPEND, self._headers(request_id, self.append_content_type),
                                        envelope(req.SerializeToString()))
            body = await resp.body()
            resp.close()
            res.append_statuses.append(resp.status)
            trailers = [parse_trailer(p) for f, p in Frames().feed(body) if f & 0x80]
            res.append_grpc_status.append(trailers[0].get("grpc-status") if trailers else None)
            if resp.status != 200:
                raise AppendRefused(f"BidiAppend seqno {seqno - 1} ({res.sent[-1]}): HTTP {resp.status}")

        async def control(eid: int, member: str, **kw: Any) -> None:
            cls = {"stream_close": pb.ExecClientStreamClose, "throw": pb.ExecClientThrow}[member]
            await append(pb.AgentClientMessage(exec_client_control_message=pb.ExecClientControlMessage(
                **{member: cls(id=eid, **kw)})))

        async def answer(esm: Any, results: list[tuple[str, Any]], streamed: bool) -> None:
            for member, value in results:
                ecm = pb.ExecClientMessage(id=esm.id, exec_id=esm.exec_id)
                getattr(ecm, member).CopyFrom(value)
                await append(pb.AgentClientMessage(exec_client_message=ecm))
            if self.close_policy == "always" or (self.close_policy == "streams-only" and streamed):
                await control(esm.id, "stream_close")
            else:
                unclosed.append(esm.id)

        stream = await self.http.post(RUNSSE, self._headers(request_id, GRPC_WEB),
                                      envelope(pb.BidiRequestId(request_id=request_id).SerializeToString()))
        if stream.status != 200:
            stream.close()
            raise RuntimeError(f"RunSSE: HTTP {stream.status}")
        try:
            await append(pb.AgentClientMessage(run_request=_run_request(prompt, conversation_id, model, tools)))
            frames = Frames()
            calls: dict[str, str] = {}  # call_id → tool name from partial/started updates
            async for chunk in stream.chunks():
                for flags, payload in frames.feed(chunk):
                    if flags & 0x80:
                        res.trailer = parse_trailer(payload)
                        res.kinds.append("trailer")
                        return res
                    if flags & 0x02:
                        res.connect_end_frames += 1  # a Connect end-stream: not ours, ignored
                        continue
                    msg = pb.AgentServerMessage.FromString(payload)
                    kind = _kind(msg)
                    res.kinds.append(kind)
                    quiet_beats = quiet_beats + 1 if kind == "interaction_update.heartbeat" else 0
                    if kind == "interaction_update.heartbeat":
                        res.heartbeats += 1
                        if res.heartbeats > self.max_heartbeats:
                            res.abandoned = True
                            return res
                        if (self.close_after_heartbeats is not None and unclosed
                                and quiet_beats >= self.close_after_heartbeats):
                            for eid in unclosed:
                                await control(eid, "stream_close")
                            unclosed.clear()
                    elif kind == "interaction_update.text_delta":
                        res.text += msg.interaction_update.text_delta.text
                    elif kind == "interaction_update.turn_ended":
                        res.turn_ended = True
                    elif kind in ("interaction_update.partial_tool_call", "interaction_update.tool_call_started"):
                        upd = getattr(msg.interaction_update, kind.split(".")[1])
                        calls[upd.call_id] = upd.tool_call.WhichOneof("tool") or ""
                    elif kind.startswith("kv_server_message."):
                        await append(self._kv_answer(msg.kv_server_message))
                    elif kind.startswith("exec_server_message."):
                        esm = msg.exec_server_message
                        member = esm.WhichOneof("args")
                        if member == "request_context_args":
                            ctx = pb.RequestContext(env=pb.RequestContextEnv(os_version="linux", shell="/bin/sh"))
                            await answer(esm, [("request_context_result", pb.RequestContextResult(
                                success=pb.RequestContextSuccess(request_context=ctx)))], streamed=False)
                        elif hand_out:
                            res.tool_calls.append(_tool_call_out(esm))
                            res.abandoned = True
                            return res  # the caller runs the tool; this run is never resumed
                        else:
                            results, streamed = _local_results(esm)
                            if results:
                                await answer(esm, results, streamed)
                            else:
                                await control(esm.id, "throw", error=f"no handler for {member}",
                                              error_code="UNIMPLEMENTED")
                                await control(esm.id, "stream_close")
            return res
        except AppendRefused as exc:
            res.error = str(exc)
            return res
        finally:
            stream.close()

    def _kv_answer(self, kv: Any) -> Any:
        if kv.WhichOneof("args") == "set_blob_args":
            self.blobs[bytes(kv.set_blob_args.blob_id)] = bytes(kv.set_blob_args.blob_data)
            res = pb.KvClientMessage(id=kv.id, set_blob_result=pb.SetBlobResult())
        else:
            res = pb.KvClientMessage(id=kv.id, get_blob_result=pb.GetBlobResult())
            data = self.blobs.get(bytes(kv.get_blob_args.blob_id))
            if data is not None:
                res.get_blob_result.blob_data = data
        return pb.AgentClientMessage(kv_client_message=res)


def _run_request(prompt: str, conversation_id: str, model: str, tools: Sequence[dict[str, Any]]) -> Any:
    from google.protobuf import struct_pb2

    defs = []
    for t in tools:
        schema = struct_pb2.Value()
        schema.struct_value.update(t.get("parameters") or {"type": "object", "properties": {}})
        defs.append(pb.McpToolDefinition(name=f"opencode___{t['name']}", tool_name=t["name"],
                                         provider_identifier="opencode", description=t.get("description", ""),
                                         input_schema=schema.SerializeToString()))
    req = pb.AgentRunRequest(conversation_id=conversation_id, model_details=pb.ModelDetails(model_id=model))
    req.conversation_state.SetInParent()  # required even when empty
    uma = req.action.user_message_action
    uma.user_message.CopyFrom(pb.UserMessage(text=prompt, message_id=str(uuid.uuid4()), mode=1))
    uma.request_context.CopyFrom(pb.RequestContext(tools=defs))
    req.mcp_tools.SetInParent()
    req.mcp_tools.mcp_tools.extend(defs)
    return req


def _kind(msg: Any) -> str:
    top = msg.WhichOneof("message") or "empty"
    sub = getattr(msg, top) if top != "empty" else None
    oneof = {"interaction_update": "message", "exec_server_message": "args", "kv_server_message": "args",
             "exec_server_control_message": "message", "interaction_query": "query"}.get(top)
    member = sub.WhichOneof(oneof) if sub is not None and oneof else None
    return f"{top}.{member}" if member else top


def _describe(msg: Any) -> str:
    top = msg.WhichOneof("message") or "empty"
    sub = getattr(msg, top)
    oneof = {"exec_client_message": "result", "kv_client_message": "result",
             "exec_client_control_message": "message"}.get(top)
    member = sub.WhichOneof(oneof) if oneof else None
    return f"{top}.{member}" if member else top


def _tool_call_out(esm: Any) -> ToolCallOut:
    from google.protobuf import json_format, struct_pb2

    member = esm.WhichOneof("args")
    args = getattr(esm, member)
    kind = member.removesuffix("_args")
    if kind == "mcp":
        values = {k: json_format.MessageToDict(struct_pb2.Value.FromString(v)) for k, v in args.args.items()}
        base = args.tool_call_id or str(esm.id)
        return ToolCallOut(f"call_{base.replace('-', '')[:24]}", args.tool_name or args.name, values, kind)
    names = {"shell": "bash", "shell_stream": "bash", "read": "read", "ls": "list", "grep": "grep", "write": "write"}
    values = json_format.MessageToDict(args, preserving_proto_field_name=True)
    values.pop("tool_call_id", None)
    return ToolCallOut(f"call_{esm.exec_id.replace('-', '')[:24]}", names.get(kind, kind), values, kind)


def _local_results(esm: Any) -> tuple[list[tuple[str, Any]], bool]:
    """Canned answers: a shell stream as start/stdout/exit plus the final shell_result (2026 style)."""
    member = esm.WhichOneof("args")
    if member == "shell_stream_args":
        cmd = esm.shell_stream_args.command
        out = shell_output(cmd)
        events = [pb.ShellStream(start=pb.ShellStreamStart()), pb.ShellStream(stdout=pb.ShellStreamStdout(data=out)),
                  pb.ShellStream(exit=pb.ShellStreamExit(code=0))]
        final = pb.ShellResult(success=pb.ShellSuccess(command=cmd, exit_code=0, stdout=out))
        return [("shell_stream_result", e) for e in events] + [("shell_result", final)], True
    if member == "shell_args":
        cmd = esm.shell_args.command
        return [("shell_result", pb.ShellResult(success=pb.ShellSuccess(command=cmd, exit_code=0,
                                                                         stdout=shell_output(cmd))))], False
    if member == "read_args":
        return [("read_result", pb.ReadResult(success=pb.ReadSuccess(path=esm.read_args.path, content="line\n",
                                                                      total_lines=1)))], False
    if member == "write_args":
        return [("write_result", pb.WriteResult(success=pb.WriteSuccess(path=esm.write_args.path,
                                                                         lines_created=1)))], False
    if member == "ls_args":
        node = pb.LsDirectoryTreeNode(abs_path=esm.ls_args.path or ".", num_files=1)
        return [("ls_result", pb.LsResult(success=pb.LsSuccess(directory_tree_root=node)))], False
    if member == "grep_args":
        return [("grep_result", pb.GrepResult(success=pb.GrepSuccess(pattern=esm.grep_args.pattern,
                                                                     path=esm.grep_args.path)))], False
    if member == "delete_args":
        return [("delete_result", pb.DeleteResult(success=pb.DeleteSuccess(path=esm.delete_args.path)))], False
    if member == "mcp_args":
        item = pb.McpToolResultContentItem(text=pb.McpTextContent(text="mcp ok"))
        return [("mcp_result", pb.McpResult(success=pb.McpSuccess(content=[item])))], False
    # An exec this client has no handler for: the caller gets a throw (then stream_close), as
    # Cursor's own executor does.
    return [], False


# --------------------------------------------------------------------------------------------
# Stateless history, flattened the way proxies do it
# --------------------------------------------------------------------------------------------


def flatten(messages: Sequence[dict[str, Any]], style: str = "seed") -> str:
    """OpenAI chat messages as one prompt. ``seed``: the December 2025 proxy (``User:``,
    ``[Called tool: …]``, ``[Tool result for call_…]: …``); ``opencode``: role-labelled turns with
    ``TOOL_RESULT (call_id: …)`` blocks."""
    parts: list[str] = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "system":
            parts.append(content)
        elif role == "user":
            parts.append(f"User: {content}" if style == "seed" else f"USER:\n{content}")
        elif role == "assistant":
            calls = m.get("tool_calls") or []
            if style == "seed":
                desc = "\n".join(f"[Called tool: {c['function']['name']}({c['function']['arguments']})]" for c in calls)
                parts.append(f"Assistant: {content}\n{desc}".replace(": \n", ": ") if content else f"Assistant: {desc}")
            else:
                if content:
                    parts.append(f"ASSISTANT:\n{content}")
                parts += [f"ASSISTANT TOOL_CALL (call_id: {c['id']}): {c['function']['name']} "
                          f"{c['function']['arguments']}" for c in calls]
        elif role == "tool":
            if style == "seed":
                parts.append(f"[Tool result for {m['tool_call_id']}]: {content}")
            else:
                parts.append(f"TOOL_RESULT (call_id: {m['tool_call_id']}):\n{content}")
    tail = ("\nBased on the tool results above, please continue your response:" if style == "seed"
            else "Continue with the task using the tool results above.")
    return "\n\n".join(parts) + "\n\n" + tail


def tool_round(messages: list[dict[str, Any]], call: ToolCallOut, result: str) -> list[dict[str, Any]]:
    return messages + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": call.openai_id, "type": "function", "function": {
            "name": call.name, "arguments": json.dumps(call.arguments)}}]},
        {"role": "tool", "tool_call_id": call.openai_id, "content": result},
    ]


async def _main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(description="gRPC-Web mode-D test client (HTTP/1.1, enveloped appends)")
    ap.add_argument("url")
    ap.add_argument("prompt")
    ap.add_argument("--cafile")
    ap.add_argument("--token", default="test-token")
    ap.add_argument("--tool", action="append", default=[], help="offer a tool with this name")
    ap.add_argument("--append-content-type", default=GRPC_WEB)
    ap.add_argument("--proxy", help="HTTP proxy to tunnel through (CONNECT), e.g. a workbench capture")
    args = ap.parse_args(argv)
    client = ModeDClient(args.url, args.token, args.cafile, append_content_type=args.append_content_type,
                         proxy=args.proxy)
    print("models:", ", ".join(await client.list_models()))
    res = await client.run(args.prompt, tools=[{"name": t} for t in args.tool])
    print(json.dumps({"text": res.text, "tool_calls": [c.__dict__ for c in res.tool_calls], "trailer": res.trailer,
                      "turn_ended": res.turn_ended, "append_statuses": res.append_statuses,
                      "connect_end_frames": res.connect_end_frames, "kinds": res.kinds}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(_main(sys.argv[1:])))
