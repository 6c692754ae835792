"""Sessions built in memory for the comparison's tests: frames of real kinds whose payload is their
tree's bytes (so the same bytes mean the same tree, as in a capture), steps of a coding agent
(an exec with its result and close, streamed text, heartbeats), and real OpenAI frames from the
OpenAI decoder."""

from __future__ import annotations

import json
from typing import Any

from workbench.decode.classify import Frame, default_decoder
from workbench.report.session import LoadedFrame, SessionView


def frame(seq: int, direction: str, kind: str, tree: Any, t: float, ref: int | None = None) -> LoadedFrame:
    payload = json.dumps(tree, sort_keys=True).encode()
    return LoadedFrame(seq=seq, ts_us=int(t * 1e6), direction=direction, transport="run", kind=kind, summary=kind,
                       msg_type=None, flags=0, size=len(payload), payload=payload, ref_id=ref, call_id=None,
                       error=None, meta=None, _tree=tree)


def view(frames: list[LoadedFrame], status: str = "complete") -> SessionView:
    return SessionView("s", "mem", {"status": status, "source": "test", "transport": "run"}, frames)


class Session:
    """A session written step by step: ``seq``, time and exec ids advance by themselves."""

    def __init__(self, prompt: str = "List the files here.") -> None:
        self.frames: list[LoadedFrame] = []
        self.t = 0.0
        self.ref = 0
        self.add("client", "run_request", {"run_request": {"conversation_id": "c1", "action": {
            "user_message_action": {"user_message": {"text": prompt}}}}})

    def add(self, direction: str, kind: str, tree: Any, ref: int | None = None, dt: float = 0.001) -> None:
        self.t += dt
        self.frames.append(frame(len(self.frames), direction, kind, tree, self.t, ref))

    def text(self, words: list[str]) -> None:
        for w in words:
            self.add("server", "interaction_update.text_delta", {"interaction_update": {"text_delta": {"text": w}}})

    def heartbeats(self, n: int, dt: float = 0.001) -> None:
        for _ in range(n):
            self.add("server", "interaction_update.heartbeat", {}, dt=dt)

    def exec_step(self, command: str, close: bool = True, stdout: str = "a.py\n") -> None:
        self.ref += 1
        r = self.ref
        self.text(["Running ", command, " now."])
        self.add("server", "exec_server_message.shell_args",
                 {"exec_server_message": {"id": r, "exec_id": f"x{r}", "shell_args": {"command": command}}}, ref=r)
        self.add("client", "exec_client_message.shell_result",
                 {"exec_client_message": {"id": r, "shell_result": {"stdout": stdout}}}, ref=r)
        if close:
            self.add("client", "exec_client_control_message.stream_close", {"id": r}, ref=r)
        self.heartbeats(2)

    def end(self) -> SessionView:
        self.add("server", "interaction_update.turn_ended", {"interaction_update": {"turn_ended": {}}})
        self.add("server", "end_stream", {})
        return view(self.frames)

    def cut(self, status: str = "aborted") -> SessionView:
        return view(self.frames, status)


def long_session(steps: int, *, changed: int | None = None, moved: int | None = None, stall: int = 0,
                 text_per_step: int = 20) -> SessionView:
    """``steps`` exec steps with streamed text: ``changed``: that step runs another command;
    ``moved``: that step and the next swap places; ``stall``: the last exec is never closed and this
    many heartbeats follow (the session cut, as a parked run is)."""
    s = Session()
    order = list(range(steps))
    if moved is not None:
        order[moved], order[moved + 1] = order[moved + 1], order[moved]
    for k in order:
        s.text([f"word{k}-{i} " for i in range(text_per_step)])
        last = k == order[-1]
        s.exec_step(f"rm -rf build{k}" if k == changed else f"grep -rn p{k} src", close=not (stall and last))
    if stall:
        s.heartbeats(stall, dt=1.0)
        return s.cut()
    return s.end()


def openai_session(chunks: list[bytes], status: str = "complete") -> SessionView:
    """An OpenAI chat exchange: the request, then each SSE event's data, decoded by the OpenAI decoder."""
    from workbench.decode.openai import event_frame, request_frame

    dec = default_decoder()
    req = json.dumps({"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode()
    decoded: list[tuple[str, Frame]] = [("client", request_frame(req))]
    decoded += [("server", event_frame(c)) for c in chunks]
    frames = [LoadedFrame(seq=i, ts_us=i * 1000, direction=d, transport="openai", kind=f.kind, summary=f.summary,
                          msg_type=f.msg_type, flags=f.flags, size=len(f.payload), payload=f.payload, ref_id=None,
                          call_id=None, error=f.error, meta=None, _decoder=dec)
              for i, (d, f) in enumerate(decoded)]
    return SessionView("o", "mem", {"status": status, "source": "test", "transport": "openai"}, frames)


def chat_chunk(delta: dict[str, Any] | None = None, finish: str | None = None) -> bytes:
    return json.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "gpt-4o",
                       "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}]}).encode()
