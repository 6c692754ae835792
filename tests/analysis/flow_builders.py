"""Flow files holding the failures bridge authors reported, built frame by frame (independent of
the simulator): an h2 ``Run`` flow per run, with whole request and response bodies, written by
mitmproxy's own ``FlowWriter``, and a reset noted the way the capture addon notes it on a flow
(``flow.metadata[RESET_METADATA_KEY]``), so ``workbench import`` reads it back as a capture would.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from mitmproxy import flow as mflow
from mitmproxy import io
from mitmproxy.http import Headers
from mitmproxy.test import tflow

from workbench.protocol.status import RESET_METADATA_KEY, reset_facts
from workbench.schema import pb
from workbench.wire.envelope import encode
from workbench.wire.varint import encode_varint

RUN_PATH = "/agent.v1.AgentService/Run"


def server(**fields: Any) -> bytes:
    return encode(pb.AgentServerMessage(**fields).SerializeToString())


def client(**fields: Any) -> bytes:
    return encode(pb.AgentClientMessage(**fields).SerializeToString())


def update(**fields: Any) -> bytes:
    return server(interaction_update=pb.InteractionUpdate(**fields))


def text(t: str) -> bytes:
    return update(text_delta=pb.TextDelta(text=t))


def heartbeat() -> bytes:
    return update(heartbeat=pb.Heartbeat())


def turn_ended() -> bytes:
    return update(turn_ended=pb.TurnEnded())


def checkpoint() -> bytes:
    return server(conversation_checkpoint_update=pb.ConversationStateStructure(
        token_details=pb.ConversationTokenDetails(used_tokens=10)))


def end_stream(error: dict[str, Any] | None = None) -> bytes:
    return encode(json.dumps({"error": error} if error else {}).encode(), 0x02)


def run_request(prompt: str, conversation_id: str = "conv-1") -> bytes:
    return client(run_request=pb.AgentRunRequest(
        conversation_state=pb.ConversationStateStructure(), conversation_id=conversation_id,
        action=pb.ConversationAction(user_message_action=pb.UserMessageAction(
            user_message=pb.UserMessage(text=prompt)))))


def cancel_action() -> bytes:
    return client(conversation_action=pb.ConversationAction(cancel_action=pb.CancelAction()))


def exec_shell_stream(id: int, command: str = "sleep 300") -> bytes:
    return server(exec_server_message=pb.ExecServerMessage(
        id=id, exec_id=f"e{id}", shell_stream_args=pb.ShellArgs(command=command)))


def shell_output(id: int, out: str) -> bytes:
    return client(exec_client_message=pb.ExecClientMessage(
        id=id, exec_id=f"e{id}", shell_stream_result=pb.ShellStream(stdout=pb.ShellStreamStdout(data=out))))


def unknown_exec(id: int, field: int) -> bytes:
    """An ExecServerMessage whose args are field ``field``, a case the schema does not know."""
    known = pb.ExecServerMessage(id=id, exec_id=f"e{id}").SerializeToString()
    body = b"\x0a\x00"  # an empty-ish message as the args
    inner = known + encode_varint(field << 3 | 2) + encode_varint(len(body)) + body
    outer_field = pb.AgentServerMessage.DESCRIPTOR.fields_by_name["exec_server_message"].number
    return encode(encode_varint(outer_field << 3 | 2) + encode_varint(len(inner)) + inner)


def misframed_text(t: str, off_by: int = 5) -> bytes:
    """A text_delta whose length prefix says ``off_by`` bytes more than it carries."""
    payload = pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(
        text_delta=pb.TextDelta(text=t))).SerializeToString()
    return bytes([0]) + (len(payload) + off_by).to_bytes(4, "big") + payload


def run_flow(request: Sequence[bytes], response: Sequence[bytes], *, start: float = 1_700_000_000.0,
             duration: float = 1.0, reset: dict[str, Any] | None = None, error: str | None = None,
             status: int = 200) -> Any:
    """An h2 Run flow with these request and response envelopes (whole bodies)."""
    f = tflow.tflow(resp=True)
    f.request.host, f.request.port, f.request.scheme = "api2.cursor.sh", 443, "https"
    f.request.method, f.request.path, f.request.http_version = "POST", RUN_PATH, "HTTP/2.0"
    f.request.headers = Headers([(b"content-type", b"application/connect+proto")])
    f.request.raw_content = b"".join(request)
    f.request.timestamp_start, f.request.timestamp_end = start, start + duration
    f.response.http_version, f.response.status_code = "HTTP/2.0", status
    f.response.headers = Headers([(b"content-type", b"application/connect+proto")])
    f.response.raw_content = b"".join(response)
    f.response.timestamp_start, f.response.timestamp_end = start + 0.05, start + duration
    f.response.trailers = None
    f.metadata = {}
    if reset is not None:
        f.metadata[RESET_METADATA_KEY] = reset
    if error is not None:
        f.error = mflow.Error(error)
    return f


def client_reset(code: int = 8, *, after_response_end: bool = False) -> dict[str, Any]:
    """``meta.reset`` of an HTTP/2 RST_STREAM the client sent (8: CANCEL)."""
    return reset_facts("client", after_response_end, code)


def server_reset(code: int = 2, *, after_response_end: bool = True) -> dict[str, Any]:
    return reset_facts("server", after_response_end, code)


def client_disconnect() -> dict[str, Any]:
    return reset_facts("client", False, None, "client disconnected")


def write_flows(path: Path, flows: Iterable[Any]) -> Path:
    with path.open("wb") as fh:
        w = io.FlowWriter(fh)
        for f in flows:
            w.add(f)
    return path
