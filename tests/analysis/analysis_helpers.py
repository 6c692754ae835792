"""Hand-built sessions for the rule unit tests: real protobuf messages, the real classifier and the
real Recorder writing into a DuckDB file in tmp_path."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from workbench.decode.classify import CLIENT_MSG, SERVER_MSG, default_decoder
from workbench.schema import pb
from workbench.store.db import SessionInfo, Store
from workbench.store.recorder import Recorder


class SessionBuilder:
    """Append agent messages to one session; ``done()`` flushes and returns the session id."""

    def __init__(self, store: Store, session_id: str = "s1", *, status: str = "complete",
                 transport: str = "run", conversation_id: str | None = None) -> None:
        self.store = store
        self.rec = Recorder(store)
        self.sid = session_id
        self.transport = transport
        self.info = self.rec.open_session(SessionInfo(session_id, source="test", transport=transport,
                                                      conversation_id=conversation_id))
        self.status = status
        self.ts = 1_700_000_000_000_000
        self.dec = default_decoder()
        self.seqs: list[int] = []

    def _add(self, msg: Any, direction: str, msg_type: str, *, dt_ms: int = 10, **kw: Any) -> int:
        self.ts += dt_ms * 1000
        f = self.dec.classify_agent(msg.SerializeToString(), msg_type)
        for k, v in kw.items():
            setattr(f, k, v)
        seq = self.rec.add(self.sid, self.ts, direction, self.transport if direction == "server" or
                           self.transport == "run" else "bidi_append", None, f)
        self.seqs.append(seq)
        return seq

    def server(self, dt_ms: int = 10, **fields: Any) -> int:
        return self._add(pb.AgentServerMessage(**fields), "server", SERVER_MSG, dt_ms=dt_ms)

    def client(self, dt_ms: int = 10, **fields: Any) -> int:
        return self._add(pb.AgentClientMessage(**fields), "client", CLIENT_MSG, dt_ms=dt_ms)

    def append(self, seqno: int, request_id: str = "req-1", **fields: Any) -> int:
        """A client message as a BidiAppend (transport bidi_append) with its seqno."""
        return self._add(pb.AgentClientMessage(**fields), "client", CLIENT_MSG, append_seqno=seqno,
                         request_id=request_id)

    # common messages ---------------------------------------------------------------------------

    def run_request(self, *, state: Any = None, omit_state: bool = False, conversation_id: str = "conv-1",
                    text: str = "hello") -> int:
        rr = pb.AgentRunRequest(conversation_id=conversation_id,
                                action=pb.ConversationAction(user_message_action=pb.UserMessageAction(
                                    user_message=pb.UserMessage(text=text))))
        if not omit_state:
            rr.conversation_state.CopyFrom(state if state is not None else pb.ConversationStateStructure())
        return self.client(run_request=rr)

    def update(self, dt_ms: int = 10, **fields: Any) -> int:
        return self.server(dt_ms, interaction_update=pb.InteractionUpdate(**fields))

    def heartbeat(self, dt_ms: int = 100) -> int:
        return self.update(dt_ms, heartbeat=pb.Heartbeat())

    def text(self, text: str) -> int:
        return self.update(text_delta=pb.TextDelta(text=text))

    def turn_ended(self) -> int:
        return self.update(turn_ended=pb.TurnEnded())

    def checkpoint(self, state: Any = None) -> int:
        return self.server(conversation_checkpoint_update=state if state is not None else pb.ConversationStateStructure(
            token_details=pb.ConversationTokenDetails(used_tokens=10)))

    def end_stream(self, error: dict[str, Any] | None = None) -> int:
        body = json.dumps({"error": error} if error else {}).encode()
        f = self.dec.decode_body(b"\x02" + len(body).to_bytes(4, "big") + body, "run", "server")[0]
        self.ts += 10_000
        seq = self.rec.add(self.sid, self.ts, "server", self.transport, None, f)
        self.seqs.append(seq)
        return seq

    def exec_shell(self, id: int, command: str = "echo hi", call_id: str | None = None) -> int:
        return self.server(exec_server_message=pb.ExecServerMessage(
            id=id, exec_id=f"e{id}", shell_stream_args=pb.ShellArgs(command=command, tool_call_id=call_id or "")))

    def shell_result(self, id: int, seqno: int | None = None) -> int:
        fields = {"exec_client_message": pb.ExecClientMessage(
            id=id, exec_id=f"e{id}", shell_stream_result=pb.ShellStream(exit=pb.ShellStreamExit(code=0)))}
        return self.append(seqno, **fields) if seqno is not None else self.client(**fields)

    def stream_close(self, id: int, seqno: int | None = None) -> int:
        fields = {"exec_client_control_message": pb.ExecClientControlMessage(
            stream_close=pb.ExecClientStreamClose(id=id))}
        return self.append(seqno, **fields) if seqno is not None else self.client(**fields)

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
    return sorted({f.code for f in findings})
