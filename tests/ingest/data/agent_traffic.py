"""Realistic agent traffic recorded by a real ``mitmdump -w`` (test data generator, not a mock).

A small HTTP/1.1 server answers the agent paths the way Cursor's backend does in transport mode B
(RunSSE + BidiAppend, docs/protocol.md §1, §3) with bodies built from the real protobuf overlay and
Connect envelopes. A client sends requests through mitmdump, so the flow file is what mitmproxy
itself writes. One RunSSE response is larger than ``stream_large_bodies`` so mitmdump streams it
and keeps no body: the "streamed, no body" case. ``mitmdump -nr FLOWS --set hardump=OUT`` then
produces the HAR from the same flows.

Run directly to regenerate the committed samples: ``python agent_traffic.py OUTDIR``.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from workbench.schema import pb
from workbench.wire.envelope import FLAG_END_STREAM, encode

# Secrets that must never reach a database in clear (the tests grep the DB file for them).
# Fake values shaped like the real ones, but matching no secret scanner's pattern.
TOKEN = "test-jwt-header.dGVzdC1wYXlsb2FkLW5vdC1yZWFs.test-signature-0123456789"
COOKIE = "CursorCookie=Cookie-eyJhbGciOiJIUzI1"
CLIENT_KEY = "9f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a0"
CHECKSUM = "zQ1xYWJjZGVm/4c2b8a0f9e1d3c5b7a9e8f7d6c5b4a3928170615243342516070"
MODEL_KEY = "test-model-api-key-not-real-0123456789abcdefABCDEF"  # user's own model key (BYOK)
SECRETS = (TOKEN, COOKIE, CLIENT_KEY, CHECKSUM, MODEL_KEY)

RID_OK = "3f2b6c1e-8d4a-4f7b-9c2e-1a5d7e9b0c11"       # RunSSE + 3 appends, clean end-stream
RID_BIG = "7a1c9e2d-4b6f-4e8a-b3d5-c7f9a1e3b5d2"      # streamed by mitmdump: no body kept
RID_LIMIT = "c0ffee00-1111-4222-8333-944455556666"    # end-stream error resource_exhausted
RID_POLL = "5e1d7c3b-2a49-4f86-8d0e-b1c2d3e4f5a6"     # transport C: RunPoll + BidiAppend
CALL_ID = "toolu_01Shell\nfc_9a8b"                    # call ids can contain a newline
CLIENT_VERSION = "cli-2026.05.01-eea359f"
STREAM_THRESHOLD = 32 * 1024


def headers_for(request_id: str, content_type: str) -> dict[str, str]:
    return {
        "content-type": content_type,
        "connect-protocol-version": "1",
        "authorization": f"Bearer {TOKEN}",
        "cookie": COOKIE,
        "x-client-key": CLIENT_KEY,
        "x-cursor-checksum": CHECKSUM,
        "x-request-id": request_id,
        "x-cursor-client-version": CLIENT_VERSION,
        "x-cursor-client-type": "cli",
        "x-ghost-mode": "true",
        "x-cursor-streaming": "true",
        "user-agent": "connect-es/1.6.1",
    }


def server_frames(kind: str) -> bytes:
    """The RunSSE response body for one scenario."""
    m = pb.AgentServerMessage
    iu = pb.InteractionUpdate
    if kind == "big":
        chunk = "lorem ipsum dolor sit amet " * 40
        body = b"".join(encode(m(interaction_update=iu(text_delta=pb.TextDelta(text=chunk)))
                               .SerializeToString()) for _ in range(40))
        return body + encode(b"{}", flags=FLAG_END_STREAM)
    if kind == "limit":
        err = {"error": {"code": "resource_exhausted", "message": "Error",
                         "details": [{"type": "aiserver.v1.ErrorDetails",
                                      "debug": {"error": "ERROR_RATE_LIMITED_CHANGEABLE",
                                                "details": {"title": "Usage limit reached"}}}]}}
        return encode(json.dumps(err).encode(), flags=FLAG_END_STREAM)
    shell = pb.ShellArgs(command="ls -la", working_directory="/repo", tool_call_id=CALL_ID)
    msgs = [
        m(interaction_update=iu(thinking_delta=pb.ThinkingDelta(text="The user wants a listing."))),
        m(interaction_update=iu(text_delta=pb.TextDelta(text="I'll list the files."))),
        m(interaction_update=iu(tool_call_started=pb.ToolCallStarted(
            call_id=CALL_ID, model_call_id="mc_1",
            tool_call=pb.ToolCall(shell_tool_call=pb.ShellToolCall(args=shell))))),
        m(exec_server_message=pb.ExecServerMessage(id=1, exec_id="ex-1", shell_args=shell)),
        m(interaction_update=iu(text_delta=pb.TextDelta(text="There are 3 files."))),
        m(interaction_update=iu(turn_ended=pb.TurnEnded())),
    ]
    return b"".join(encode(x.SerializeToString()) for x in msgs) + encode(b"{}", flags=FLAG_END_STREAM)


def poll_frames() -> bytes:
    """RunPoll response: enveloped BidiPollResponse records with base64 AgentServerMessages."""
    import base64

    msg = pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(text_delta=pb.TextDelta(text="Polled.")))
    recs = [pb.BidiPollResponse(seqno=0, data=base64.b64encode(msg.SerializeToString()).decode()),
            pb.BidiPollResponse(seqno=1, eof=True)]
    return b"".join(encode(r.SerializeToString()) for r in recs) + encode(b"{}", flags=FLAG_END_STREAM)


def client_messages() -> list[bytes]:
    """AgentClientMessages of the OK run, by append_seqno."""
    c = pb.AgentClientMessage
    run = c(run_request=pb.AgentRunRequest(
        conversation_state=pb.ConversationStateStructure(), conversation_id="conv-7f3e",
        model_details=pb.ModelDetails(model_id="claude-4.5-sonnet", api_key_credentials=pb.ApiKeyCredentials(
            api_key=MODEL_KEY, base_url="https://api.anthropic.com")),
        action=pb.ConversationAction(user_message_action=pb.UserMessageAction(
            user_message=pb.UserMessage(text="list the files", message_id="m-1")))))
    result = c(exec_client_message=pb.ExecClientMessage(id=1, exec_id="ex-1", shell_result=pb.ShellResult(
        success=pb.ShellSuccess(command="ls -la", exit_code=0, stdout="a.py\nb.py\nc.py\n"))))
    beat = c(client_heartbeat=pb.ClientHeartbeat())
    return [run.SerializeToString(), result.SerializeToString(), beat.SerializeToString()]


def append_body(request_id: str, seqno: int, inner: bytes) -> bytes:
    return pb.BidiAppendRequest(data=inner.hex(), request_id=pb.BidiRequestId(request_id=request_id),
                                append_seqno=seqno).SerializeToString()


class AgentHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802
        self._send(200, b"ok\n", "text/plain")

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        path = self.path.split("?")[0]
        if path.endswith("/agent.v1.AgentService/RunSSE"):
            rid = pb.BidiRequestId.FromString(body[5:]).request_id
            kind = {RID_BIG: "big", RID_LIMIT: "limit"}.get(rid, "ok")
            self._send(200, server_frames(kind), "application/connect+proto")
        elif path.endswith("/agent.v1.AgentService/RunPoll"):
            self._send(200, poll_frames(), "application/connect+proto")
        elif path.endswith("/aiserver.v1.BidiService/BidiAppend"):
            self._send(200, b"", "application/proto")
        elif path.endswith("/agent.v1.AgentService/Run"):
            self._send(464, b"", "text/plain")  # the ALB's answer to HTTP/1.1 on the h2-only Run
        elif path.endswith("/agent.v1.AgentService/GetUsableModels"):
            self._send(200, b"\x0a\x11\x0a\x0fclaude-4.5-sonnet", "application/proto")
        else:
            self._send(404, b"", "text/plain")

    def _send(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def start_mitmdump(flows: Path) -> tuple[subprocess.Popen[str], int]:
    exe = Path(sys.executable).with_name("mitmdump")
    proc = subprocess.Popen(
        [str(exe), "--listen-host", "127.0.0.1", "-p", "0", "-w", str(flows),
         "--set", f"stream_large_bodies={STREAM_THRESHOLD}", "--set", "termlog_verbosity=info"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        m = re.search(r"listening at .*:(\d+)", line)
        if m:
            # keep draining mitmdump's log so it never blocks on a full pipe
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, int(m.group(1))
    proc.kill()
    raise RuntimeError("mitmdump did not start: " + "".join(seen))


def drive(proxy_port: int, server_port: int) -> None:
    base = f"http://127.0.0.1:{server_port}"

    def post(path: str, body: bytes, rid: str, ctype: str) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", proxy_port, timeout=30)
        conn.request("POST", base + path, body=body, headers=headers_for(rid, ctype))
        resp = conn.getresponse()
        resp.read()
        conn.close()
        return resp.status

    conn = http.client.HTTPConnection("127.0.0.1", proxy_port, timeout=30)
    conn.request("GET", base + "/healthz")
    conn.getresponse().read()
    conn.close()
    post("/agent.v1.AgentService/GetUsableModels", b"", RID_OK, "application/proto")
    post("/agent.v1.AgentService/Run", encode(client_messages()[0]), RID_OK, "application/connect+proto")
    msgs = client_messages()
    # Up to 16 appends are in flight, so they are captured out of order (docs/protocol.md §3).
    for seq in (2, 0, 1):
        post("/aiserver.v1.BidiService/BidiAppend", append_body(RID_OK, seq, msgs[seq]), RID_OK,
             "application/proto")
    rid_env = encode(pb.BidiRequestId(request_id=RID_OK).SerializeToString())
    post("/agent.v1.AgentService/RunSSE", rid_env, RID_OK, "application/connect+proto")
    for rid in (RID_BIG, RID_LIMIT):
        post("/aiserver.v1.BidiService/BidiAppend", append_body(rid, 0, msgs[0]), rid, "application/proto")
        post("/agent.v1.AgentService/RunSSE", encode(pb.BidiRequestId(request_id=rid).SerializeToString()),
             rid, "application/connect+proto")
    poll_req = pb.BidiPollRequest(request_id=pb.BidiRequestId(request_id=RID_POLL), start_request=True)
    post("/agent.v1.AgentService/RunPoll", encode(poll_req.SerializeToString()), RID_POLL,
         "application/connect+proto")
    post("/aiserver.v1.BidiService/BidiAppend", append_body(RID_POLL, 0, msgs[0]), RID_POLL, "application/proto")


def generate(outdir: Path) -> tuple[Path, Path]:
    """Record ``agent.flows`` with mitmdump and export ``agent.har`` from it; returns both paths."""
    outdir.mkdir(parents=True, exist_ok=True)
    flows, har = outdir / "agent.flows", outdir / "agent.har"
    server = ThreadingHTTPServer(("127.0.0.1", 0), AgentHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    proc, proxy_port = start_mitmdump(flows)
    try:
        drive(proxy_port, server.server_address[1])
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        server.shutdown()
        server.server_close()
    exe = Path(sys.executable).with_name("mitmdump")
    subprocess.run([str(exe), "-q", "-nr", str(flows), "--set", f"hardump={har}"], check=True,
                   timeout=120, env={**os.environ})
    return flows, har


if __name__ == "__main__":
    for p in generate(Path(sys.argv[1])):
        print(p)
