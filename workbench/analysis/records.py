"""What the walk over a session's frames records (``facts.FactsBuilder`` fills these).

Plain dataclasses, no logic beyond trivial properties: the rules read them, the walk writes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class HeartbeatRun:
    first_seq: int
    last_seq: int
    count: int
    first_ts: int
    last_ts: int
    seg: int
    sample: list[int]
    prev_seq: int | None = None       # last non-heartbeat server frame before the stretch
    prev_kind: str | None = None
    prev_client_seq: int | None = None  # last new client input before the stretch (see FactsBuilder)
    next_seq: int | None = None       # the server frame that ended it (None: still running / end)
    next_kind: str | None = None

    @property
    def span_s(self) -> float:
        return (self.last_ts - self.first_ts) / 1e6


@dataclass
class ExecReq:
    seg: int
    id: int
    seq: int
    ts: int
    member: str                      # e.g. shell_stream_args
    exec_id: str
    tool_call_id: str | None
    payload: bytes
    result_seqs: list[int] = field(default_factory=list)
    result_payload: bytes | None = None
    last_result: bytes | None = None  # the latest result message (a streamed shell's exit, or not yet)
    echo_payloads: list[bytes] = field(default_factory=list)
    result_ts: int | None = None
    close_seq: int | None = None
    throw_seq: int | None = None
    throw_error: str | None = None
    abort_seq: int | None = None
    client_hb_seq: int | None = None  # last ExecClientHeartbeat{id}: the client says it is still running
    later_server: int = 0            # server frames seen after it (live grace)

    @property
    def ref_seq(self) -> int:
        """Where the client's side of this exec ends: its last result (or the exec itself when the
        result precedes it in a session whose order is only the body order)."""
        return max([self.seq, *self.result_seqs])


@dataclass
class KvOp:
    seg: int
    id: int
    seq: int
    op: str                          # set | get
    blob_id: bytes
    data: bytes | None               # set: the data
    result_seq: int | None = None
    result_member: str | None = None
    result_has_data: bool = False
    result_data: bytes | None = None
    set_error: str | None = None
    later_server: int = 0
    ts: int = 0                      # when the server's request was recorded (µs)


@dataclass
class Query:
    seg: int
    id: int
    seq: int
    kind: str
    response_seq: int | None = None
    later_server: int = 0


@dataclass
class CallState:
    call_id: str
    first_seq: int
    last_seq: int
    first_ts: int
    last_ts: int
    seg: int
    model_call_id: str | None = None
    deltas: list[str] = field(default_factory=list)
    delta_seqs: list[int] = field(default_factory=list)
    args_text: str = ""
    started_seq: int | None = None
    started_payload: bytes | None = None
    completed_seq: int | None = None
    completed_payload: bytes | None = None
    tool_case: str | None = None      # ToolCall oneof member, e.g. shell_tool_call
    delta_count: int = 0


@dataclass
class RunRequest:
    seq: int
    seg: int
    has_state: bool
    state_empty: bool
    conversation_id: str
    action: str | None
    payload: bytes
    prompt: str = ""                  # the user message text (history of a stateless client lives here)
    ts: int = 0                       # when it was recorded (µs)


@dataclass
class Append:
    seq: int
    request_id: str | None
    seqno: int
    kind: str = ""
    digest: int | None = None         # hash of the carried message: a resend has the same one
    http_status: int | None = None    # from frames.meta, when the recorder kept it


@dataclass
class EndStream:
    seq: int
    ts: int
    kind: str                         # end_stream | end_stream.error
    payload: bytes
    flags: int


@dataclass
class HttpError:
    """The server's refusal of one exchange: an ``http_error`` frame (non-2xx), or an error
    end-stream / gRPC-Web trailer answering a BidiAppend."""

    seq: int
    transport: str
    text: str
    request_id: str | None = None
    seqno: int | None = None
    status: int | None = None         # HTTP status, when the frame says it
    grpc: str | None = None           # gRPC / Connect error code, for a refusal inside a 200 answer


@dataclass
class HttpFailure:
    """A client frame whose HTTP exchange was answered non-2xx (a rejected BidiAppend, a failed
    unary call), or an ``http_error`` frame standing for such an answer."""

    seq: int
    transport: str
    kind: str                         # the kind of the client frame (what the request carried)
    status: int | None                # HTTP status (200 when a gRPC status carried the refusal)
    content_type: str | None = None
    request_id: str | None = None
    seqno: int | None = None
    error_seq: int | None = None      # the http_error frame of the answer, when recorded
    error_text: str | None = None
    raw: bytes | None = None          # the request body as recorded (to tell an enveloped one)
    grpc: str | None = None           # the gRPC status code name of a refusal inside a 200 answer

    @property
    def label(self) -> str:
        if self.grpc:
            return f"HTTP {self.status or 200} with {self.grpc}"
        return f"HTTP {self.status}" if self.status else "no HTTP answer"


@dataclass
class Malformed:
    """A frame that could not be framed or parsed (kind ``malformed``), as the walk saw it."""

    seq: int
    ts: int
    direction: str
    transport: str
    payload: bytes                    # the bytes that could not be read (a frame's worth, or the rest)
    error: str
    offset: int | None = None         # byte offset of the frame in its body (stored sessions only)


@dataclass
class SessionFacts:
    session_id: str
    frame_count: int = 0
    first_seq: int | None = None
    last_seq: int | None = None
    last_ts: int | None = None
    last_server_seq: int | None = None
    last_server_kind: str | None = None
    last_progress_seq: int | None = None  # last server frame that is not a heartbeat
    last_progress_ts: int | None = None
    seg: int = 0
    seg_starts: list[int] = field(default_factory=list)  # seq of every run_request frame (segment 1, 2, …)
    # per segment: the last server frame showing any progress (not heartbeat, end, empty or KV), and
    # the last one showing the model generated something (text, thinking, tokens, step, checkpoint, end of turn)
    seg_last_any: dict[int, int] = field(default_factory=dict)
    seg_last_gen: dict[int, int] = field(default_factory=dict)
    runs: list[HeartbeatRun] = field(default_factory=list)
    open_run: HeartbeatRun | None = None
    execs: list[ExecReq] = field(default_factory=list)
    kv: list[KvOp] = field(default_factory=list)
    queries: list[Query] = field(default_factory=list)
    calls: dict[str, CallState] = field(default_factory=dict)
    run_requests: list[RunRequest] = field(default_factory=list)
    checkpoints: list[tuple[int, int, bytes]] = field(default_factory=list)  # (seq, seg, payload)
    end_streams: list[EndStream] = field(default_factory=list)
    turn_ended: list[tuple[int, int]] = field(default_factory=list)  # (seq, seg)
    text_seqs: list[int] = field(default_factory=list)
    heartbeat_seqs: list[int] = field(default_factory=list)
    appends: list[Append] = field(default_factory=list)
    ndjson: list[tuple[int, str, bytes | None, str | None]] = field(default_factory=list)
    # client messages that may echo tool-call args back (history, results): (seq, payload)
    client_payloads: list[tuple[int, bytes]] = field(default_factory=list)
    # the latest new client input (run_request, conversation action, first result of an exec)
    last_client_seq: int | None = None
    throws_unmatched: list[tuple[int, int]] = field(default_factory=list)
    kinds: dict[str, int] = field(default_factory=dict)
    malformed: list[int] = field(default_factory=list)
    malformed_frames: list[Malformed] = field(default_factory=list)
    # when each turn_ended came (seq -> µs), and the client's cancel_action conversation actions (seq, ts, seg)
    turn_ended_ts: dict[int, int] = field(default_factory=dict)
    cancels: list[tuple[int, int, int]] = field(default_factory=list)
    # client frames whose exchange failed (rejected appends, failed unary calls), by seq
    http_failures: dict[int, HttpFailure] = field(default_factory=dict)
    # refusals the server sent (http_error frames, error answers to BidiAppends)
    http_errors: list[HttpError] = field(default_factory=list)
    # client heartbeat times (epoch µs), for the client's heartbeat interval
    client_hb_ts: list[int] = field(default_factory=list)
    # client frames after the latest end-stream: (seq, ts, kind), the first ones and the last
    after_end: list[tuple[int, int, str]] = field(default_factory=list)
    after_end_count: int = 0
    # the slowest KV answer (server request → the client's answer, as recorded, µs): a round trip
    # through the client and whatever records, measured on this session's own path
    kv_round_trip_us: int = 0
