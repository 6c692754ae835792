"""The shape of a session in time: heartbeat runs, the stall, exec lifecycles.

Shared by the HTML report (what the sequence diagram collapses and marks) and ``workbench diff``
(where a stall begins, which exec lost its ``stream_close``). Works on ``LoadedFrame`` lists, so a
session from any source (capture, import, fixture) gives the same shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from workbench.protocol import kinds

# A stall: at least this many server heartbeats with no other server frame after them (the end
# of the recording, or the end of the stream, came next). The analysis' own threshold is the same.
STALL_MIN_HEARTBEATS = 5
# Heartbeat runs shorter than this stay as single arrows in the diagram.
COLLAPSE_MIN = 2


@dataclass
class HeartbeatRun:
    first: int          # index into the frame list
    last: int
    seqs: list[int]
    first_ts_us: int
    last_ts_us: int

    @property
    def count(self) -> int:
        return len(self.seqs)

    @property
    def span_s(self) -> float:
        return (self.last_ts_us - self.first_ts_us) / 1e6


class StallDoc(TypedDict, total=False):
    """A stall as the session diff and the JSON outputs write it (``Stall.as_dict`` gives every key;
    not total, so that a session diff's ``Difference`` of type stall can extend it)."""

    first_seq: int
    last_seq: int
    heartbeats: int
    span_s: float
    start_offset_s: float
    after_seq: int | None
    after_kind: str | None
    last_client_seq: int | None
    last_client_kind: str | None


@dataclass
class Stall:
    """A run of server heartbeats that nothing but the end followed: the session parked."""

    run: HeartbeatRun
    after_seq: int | None      # the last server frame that was progress (None: no such frame)
    after_kind: str | None
    last_client_seq: int | None
    last_client_kind: str | None
    start_offset_s: float      # from the session's first frame

    def as_dict(self) -> StallDoc:
        return {"first_seq": self.run.seqs[0], "last_seq": self.run.seqs[-1], "heartbeats": self.run.count,
                "span_s": round(self.run.span_s, 3), "start_offset_s": round(self.start_offset_s, 3),
                "after_seq": self.after_seq, "after_kind": self.after_kind,
                "last_client_seq": self.last_client_seq, "last_client_kind": self.last_client_kind}

    def describe(self) -> str:
        after = f" after {self.after_kind} (seq {self.after_seq})" if self.after_seq is not None else ""
        client = (f"; the client's last message was {self.last_client_kind} (seq {self.last_client_seq})"
                  if self.last_client_seq is not None else "")
        return (f"heartbeat stall begins at seq {self.run.seqs[0]} (+{self.start_offset_s:.3f} s){after}: "
                f"{self.run.count} server heartbeats over {self.run.span_s:.3f} s and no progress{client}")


def heartbeat_runs(frames: Sequence[Any]) -> list[HeartbeatRun]:
    """Runs of server heartbeats; client frames between them (keep-alives, late answers) do not
    break a run, any other server frame does."""
    runs: list[HeartbeatRun] = []
    cur: list[int] = []

    def close() -> None:
        if cur:
            runs.append(HeartbeatRun(cur[0], cur[-1], [frames[i].seq for i in cur], frames[cur[0]].ts_us,
                                     frames[cur[-1]].ts_us))
            cur.clear()

    for i, f in enumerate(frames):
        if f.direction != "server":
            continue
        if kinds.is_server_heartbeat(f.kind):
            cur.append(i)
        else:
            close()
    close()
    return runs


def find_stall(frames: Sequence[Any], runs: list[HeartbeatRun] | None = None) -> Stall | None:
    """The heartbeat run the session ended in, when it is long enough to be a stall."""
    runs = heartbeat_runs(frames) if runs is None else runs
    if not runs or runs[-1].count < STALL_MIN_HEARTBEATS:
        return None
    run = runs[-1]
    for f in frames[run.last + 1:]:
        if f.direction == "server" and not (kinds.is_end_stream(f.kind) or f.kind == kinds.EMPTY):
            return None  # the server went on after the heartbeats: a slow step, not a stall
    after = next((f for f in reversed(frames[:run.first]) if f.direction == "server"), None)
    client = next((f for f in reversed(frames[:run.first]) if f.direction == "client"
                   and not kinds.is_client_heartbeat(f.kind)), None)
    t0 = frames[0].ts_us
    return Stall(run, after.seq if after else None, after.kind if after else None,
                 client.seq if client else None, client.kind if client else None, (run.first_ts_us - t0) / 1e6)


@dataclass
class Exec:
    """One exec the server asked for, and how the client answered it."""

    ref_id: int
    name: str                   # shell, read, request_context, …
    request_seq: int
    request_kind: str
    results: list[tuple[int, str]] = field(default_factory=list)   # (seq, kind)
    close_seq: int | None = None
    throw_seq: int | None = None
    abort_seq: int | None = None

    @property
    def ending(self) -> str:
        if self.close_seq is not None:
            return "stream_close"
        if self.throw_seq is not None:
            return "throw"
        if self.abort_seq is not None:
            return "abort"
        return "open"


def exec_name(kind: str) -> str:
    return kinds.member(kind).removesuffix("_args") or kind


def execs(frames: Sequence[Any]) -> list[Exec]:
    """The session's execs in request order, each with its results and how it closed."""
    out: list[Exec] = []
    open_by_id: dict[int, Exec] = {}
    for f in frames:
        ref = f.ref_id
        if ref is None:
            continue
        if f.direction == "server" and kinds.in_family(f.kind, kinds.EXEC_SERVER):
            e = Exec(int(ref), exec_name(f.kind), f.seq, f.kind)
            out.append(e)
            open_by_id[int(ref)] = e
            continue
        found = open_by_id.get(int(ref))
        if found is None:
            continue
        e = found
        if f.kind == kinds.EXEC_STREAM_CLOSE:
            e.close_seq = f.seq
        elif f.kind == kinds.EXEC_THROW:
            e.throw_seq = f.seq
        elif f.kind == kinds.EXEC_ABORT:
            e.abort_seq = f.seq
        elif f.direction == "client" and kinds.in_family(f.kind, kinds.EXEC_CLIENT):
            e.results.append((f.seq, f.kind))
    return out
