"""Hand-built sessions for the rule unit tests: real protobuf messages, the real classifier and the
real Recorder writing into a DuckDB file in tmp_path."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from workbench.decode.classify import CLIENT_MSG, SERVER_MSG, default_decoder, http_error_frame
from workbench.schema import pb
from workbench.store.db import SessionInfo, Store
from workbench.store.recorder import Recorder


class SessionBuilder:
    """Append agent messages to one session; ``done()`` flushes and returns the session id.

    With a RunSSE/RunPoll transport, ``client(...)`` sends each message as a BidiAppend with the
    next append_seqno (``auto_seqno``), as a real client does."""

    def __init__(self, store: Store, session_id: str = "s1", *, status: str = "complete",
                 transport: str = "run", conversation_id: str | None = None, meta: dict[str, Any] | None = None,
                 source: str = "test", http_status: int | None = None, path: str | None = None,
                 error: str | None = None, request_id: str = "req-1") -> None:
        self.store = store
        self.rec = Recorder(store)
        self.sid = session_id
        self.transport = transport
        self.info = self.rec.open_session(SessionInfo(session_id, source=source, transport=transport,
                                                      conversation_id=conversation_id, meta=dict(meta or {}),
                                                      http_status=http_status, path=path, error=error))
        self.status = status
        self.ts = 1_700_000_000_000_000
        self.dec = default_decoder()
        self.seqs: list[int] = []
        self.request_id = request_id
        self.next_seqno = 0
        self.auto_seqno = transport in ("runsse", "runpoll")

    def _write(self, f: Any, direction: str, transport: str, dt_ms: int) -> int:
        self.ts += dt_ms * 1000
        seq = self.rec.add(self.sid, self.ts, direction, transport, None, f)
        self.seqs.append(seq)
        return seq

    def _add(self, msg: Any, direction: str, msg_type: str, *, dt_ms: int = 10, **kw: Any) -> int:
        f = self.dec.classify_agent(msg.SerializeToString(), msg_type)
        if direction == "client" and self.auto_seqno and "append_seqno" not in kw:
            kw.setdefault("append_seqno", self.next_seqno)
            kw.setdefault("request_id", self.request_id)
            self.next_seqno += 1
        for k, v in kw.items():
            setattr(f, k, v)
        transport = self.transport if direction == "server" or self.transport in ("run", "unary") else "bidi_append"
        return self._write(f, direction, transport, dt_ms)

    def server(self, dt_ms: int = 10, **fields: Any) -> int:
        return self._add(pb.AgentServerMessage(**fields), "server", SERVER_MSG, dt_ms=dt_ms)

    def client(self, dt_ms: int = 10, meta: dict[str, Any] | None = None, **fields: Any) -> int:
        kw: dict[str, Any] = {"meta": meta} if meta is not None else {}
        return self._add(pb.AgentClientMessage(**fields), "client", CLIENT_MSG, dt_ms=dt_ms, **kw)

    def append(self, seqno: int, request_id: str = "req-1", meta: dict[str, Any] | None = None,
               raw: bytes | None = None, **fields: Any) -> int:
        """A client message as a BidiAppend (transport bidi_append) with an explicit seqno; ``meta``
        the facts of its exchange (HTTP status, content type), ``raw`` the request body as sent."""
        kw: dict[str, Any] = {"meta": meta} if meta is not None else {}
        if raw is not None:
            kw["raw"] = raw
        f = self.dec.classify_agent(pb.AgentClientMessage(**fields).SerializeToString(), CLIENT_MSG)
        f.append_seqno, f.request_id = seqno, request_id
        for k, v in kw.items():
            setattr(f, k, v)
        return self._write(f, "client", "bidi_append", 10)

    def http_error(self, status: int, body: bytes = b"", *, transport: str = "bidi_append",
                   seqno: int | None = None) -> int:
        """The server side of a non-2xx answer, as capture records it (an ``http_error`` frame)."""
        f = http_error_frame(status, body)
        if transport == "bidi_append":
            f.request_id, f.append_seqno = self.request_id, seqno
        return self._write(f, "server", transport, 10)

    # common messages ---------------------------------------------------------------------------

    def run_request(self, *, state: Any = None, omit_state: bool = False, conversation_id: str = "conv-1",
                    text: str = "hello", meta: dict[str, Any] | None = None) -> int:
        rr = pb.AgentRunRequest(conversation_id=conversation_id,
                                action=pb.ConversationAction(user_message_action=pb.UserMessageAction(
                                    user_message=pb.UserMessage(text=text))))
        if not omit_state:
            rr.conversation_state.CopyFrom(state if state is not None else pb.ConversationStateStructure())
        return self.client(run_request=rr, meta=meta)

    def update(self, dt_ms: int = 10, **fields: Any) -> int:
        return self.server(dt_ms, interaction_update=pb.InteractionUpdate(**fields))

    def heartbeat(self, dt_ms: int = 100) -> int:
        return self.update(dt_ms, heartbeat=pb.Heartbeat())

    def client_heartbeat(self, dt_ms: int = 100, meta: dict[str, Any] | None = None) -> int:
        return self.client(dt_ms, meta=meta, client_heartbeat=pb.ClientHeartbeat())

    def text(self, text: str) -> int:
        return self.update(text_delta=pb.TextDelta(text=text))

    def turn_ended(self) -> int:
        return self.update(turn_ended=pb.TurnEnded())

    def checkpoint(self, state: Any = None) -> int:
        return self.server(conversation_checkpoint_update=state if state is not None else pb.ConversationStateStructure(
            token_details=pb.ConversationTokenDetails(used_tokens=10)))

    def end_stream(self, error: dict[str, Any] | None = None, dt_ms: int = 10) -> int:
        body = json.dumps({"error": error} if error else {}).encode()
        return self._envelope(0x02, body, dt_ms)

    def grpc_web_trailer(self, status: int, message: str = "", extra: str = "", dt_ms: int = 10) -> int:
        """The gRPC-Web end of a response: a 0x80 frame with grpc-status / grpc-message lines."""
        body = f"grpc-status: {status}\r\ngrpc-message: {message}\r\n{extra}".encode()
        return self._envelope(0x80, body, dt_ms)

    def _envelope(self, flags: int, body: bytes, dt_ms: int) -> int:
        transport = "run" if self.transport == "unary" else self.transport
        f = self.dec.decode_body(bytes([flags]) + len(body).to_bytes(4, "big") + body, transport, "server")[0]
        return self._write(f, "server", self.transport, dt_ms)

    def exec_shell(self, id: int, command: str = "echo hi", call_id: str | None = None,
                   member: str = "shell_stream_args") -> int:
        return self.server(exec_server_message=pb.ExecServerMessage(
            id=id, exec_id=f"e{id}", **{member: pb.ShellArgs(command=command, tool_call_id=call_id or "")}))

    def shell_result(self, id: int, seqno: int | None = None) -> int:
        fields = {"exec_client_message": pb.ExecClientMessage(
            id=id, exec_id=f"e{id}", shell_stream_result=pb.ShellStream(exit=pb.ShellStreamExit(code=0)))}
        return self.append(seqno, **fields) if seqno is not None else self.client(**fields)

    def exec_result(self, id: int, **result: Any) -> int:
        return self.client(exec_client_message=pb.ExecClientMessage(id=id, exec_id=f"e{id}", **result))

    def stream_close(self, id: int, seqno: int | None = None) -> int:
        fields = {"exec_client_control_message": pb.ExecClientControlMessage(
            stream_close=pb.ExecClientStreamClose(id=id))}
        return self.append(seqno, **fields) if seqno is not None else self.client(**fields)

    def throw(self, id: int, error: str = "unsupported", code: str = "UNIMPLEMENTED") -> int:
        return self.client(exec_client_control_message=pb.ExecClientControlMessage(
            throw=pb.ExecClientThrow(id=id, error=error, error_code=code)))

    def set_blob(self, id: int, data: bytes, blob_id: bytes | None = None) -> tuple[int, bytes]:
        bid = blob_id or hashlib.sha256(data).digest()
        seq = self.server(kv_server_message=pb.KvServerMessage(id=id, set_blob_args=pb.SetBlobArgs(
            blob_id=bid, blob_data=data)))
        return seq, bid

    def set_blob_result(self, id: int) -> int:
        return self.client(kv_client_message=pb.KvClientMessage(id=id, set_blob_result=pb.SetBlobResult()))

    def get_blob(self, id: int, blob_id: bytes) -> int:
        return self.server(kv_server_message=pb.KvServerMessage(id=id, get_blob_args=pb.GetBlobArgs(blob_id=blob_id)))

    def get_blob_result(self, id: int, data: bytes | None) -> int:
        res = pb.GetBlobResult() if data is None else pb.GetBlobResult(blob_data=data)
        return self.client(kv_client_message=pb.KvClientMessage(id=id, get_blob_result=res))

    def done(self) -> str:
        self.info.status = self.status
        self.rec.touch(self.sid)
        self.rec.flush()
        return self.sid

    # a complete healthy tool turn ----------------------------------------------------------------

    def healthy_shell_turn(self, call_id: str = "call-1", exec_id: int = 1, command: str = "echo hi") -> None:
        args = json.dumps({"command": command})
        for cut in (len(args) // 3, 2 * len(args) // 3, len(args)):
            self.update(partial_tool_call=pb.PartialToolCall(call_id=call_id, args_text_delta=args[:cut]))
        tc = pb.ToolCall(shell_tool_call=pb.ShellToolCall(args=pb.ShellArgs(command=command)))
        self.update(tool_call_started=pb.ToolCallStarted(call_id=call_id, tool_call=tc))
        self.exec_shell(exec_id, command, call_id)
        self.shell_result(exec_id)
        self.stream_close(exec_id)
        self.update(tool_call_completed=pb.ToolCallCompleted(call_id=call_id, tool_call=tc))


def analysis_codes(findings: list[Any]) -> list[str]:
    """Codes of the findings proper: notes (severity "note") did no harm and are left out."""
    return sorted({f.code for f in findings if f.severity != "note"})
