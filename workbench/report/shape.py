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
    first_seq: int
    last_seq: int
    count: int           # server heartbeats in the run
    first_ts_us: int
    last_ts_us: int

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
        return {"first_seq": self.run.first_seq, "last_seq": self.run.last_seq, "heartbeats": self.run.count,
                "span_s": round(self.run.span_s, 3), "start_offset_s": round(self.start_offset_s, 3),
                "after_seq": self.after_seq, "after_kind": self.after_kind,
                "last_client_seq": self.last_client_seq, "last_client_kind": self.last_client_kind}

    def describe(self) -> str:
        after = f" after {self.after_kind} (seq {self.after_seq})" if self.after_seq is not None else ""
        client = (f"; the client's last message was {self.last_client_kind} (seq {self.last_client_seq})"
                  if self.last_client_seq is not None else "")
        return (f"heartbeat stall begins at seq {self.run.first_seq} (+{self.start_offset_s:.3f} s){after}: "
                f"{self.run.count} server heartbeats over {self.run.span_s:.3f} s and no progress{client}")


def heartbeat_runs(frames: Sequence[Any]) -> list[HeartbeatRun]:
    """Runs of server heartbeats; client frames between them (keep-alives, late answers) do not
    break a run, any other server frame does."""
    runs: list[HeartbeatRun] = []
    cur: HeartbeatRun | None = None
    for f in frames:
        if f.direction != "server":
            continue
        if kinds.is_server_heartbeat(f.kind):
            if cur is None:
                cur = HeartbeatRun(f.seq, f.seq, 0, f.ts_us, f.ts_us)
                runs.append(cur)
            cur.count += 1
            cur.last_seq, cur.last_ts_us = f.seq, f.ts_us
        else:
            cur = None
    return runs


class StallWatch:
    """``find_stall`` one frame at a time, for a view that reads a session in batches: it keeps the
    current heartbeat run and what came before it, never the frames."""

    def __init__(self) -> None:
        self.t0: int | None = None
        self.run: HeartbeatRun | None = None          # the last run of server heartbeats
        self.open = False                             # the run is still growing
        self.spoiled = False                          # a server frame of progress came after the last run
        self.before: tuple[Any, Any] = (None, None)   # (last server frame, last client message) before it
        self._server: tuple[int, str] | None = None
        self._client: tuple[int, str] | None = None

    def add(self, f: Any) -> None:
        """One frame, or one item standing for ``f.count`` frames alike in a row (``session.LinkedFrame``)."""
        if self.t0 is None:
            self.t0 = f.ts_us
        n = getattr(f, "count", 1)
        last_seq = f.seq if n == 1 else f.last_seq
        last_ts = f.ts_us if n == 1 else f.last_ts_us
        if f.direction == "server":
            if kinds.is_server_heartbeat(f.kind):
                if self.open and self.run is not None:
                    self.run.count += n
                    self.run.last_seq, self.run.last_ts_us = last_seq, last_ts
                else:
                    self.run = HeartbeatRun(f.seq, last_seq, n, f.ts_us, last_ts)
                    self.open, self.spoiled = True, False
                    self.before = (self._server, self._client)
            else:
                self.open = False
                if not (kinds.is_end_stream(f.kind) or f.kind == kinds.EMPTY):
                    self.spoiled = True
            self._server = (last_seq, f.kind)
        elif not kinds.is_client_heartbeat(f.kind):
            self._client = (last_seq, f.kind)

    def stall(self) -> Stall | None:
        run = self.run
        if run is None or run.count < STALL_MIN_HEARTBEATS or self.spoiled:
            return None
        after, client = self.before
        return Stall(run, after[0] if after else None, after[1] if after else None,
                     client[0] if client else None, client[1] if client else None,
                     (run.first_ts_us - (self.t0 or 0)) / 1e6)


def find_stall(frames: Sequence[Any]) -> Stall | None:
    """The heartbeat run the session ended in, when it is long enough to be a stall (a tail of at
    least ``STALL_MIN_HEARTBEATS`` server heartbeats with nothing but the end after them)."""
    watch = StallWatch()
    for f in frames:
        watch.add(f)
    return watch.stall()


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


class ExecTracker:
    """The session's execs, one frame at a time (``execs`` over a list; the report feeds it batches)."""

    def __init__(self) -> None:
        self.execs: list[Exec] = []
        self._open: dict[int, Exec] = {}

    def add(self, f: Any) -> None:
        ref = f.ref_id
        if ref is None:
            return
        if f.direction == "server" and kinds.in_family(f.kind, kinds.EXEC_SERVER):
            e = Exec(int(ref), exec_name(f.kind), f.seq, f.kind)
            self.execs.append(e)
            self._open[int(ref)] = e
            return
        found = self._open.get(int(ref))
        if found is None:
            return
        e = found
        if f.kind == kinds.EXEC_STREAM_CLOSE:
            e.close_seq = f.seq
        elif f.kind == kinds.EXEC_THROW:
            e.throw_seq = f.seq
        elif f.kind == kinds.EXEC_ABORT:
            e.abort_seq = f.seq
        elif f.direction == "client" and kinds.in_family(f.kind, kinds.EXEC_CLIENT):
            e.results.append((f.seq, f.kind))


def execs(frames: Sequence[Any]) -> list[Exec]:
    """The session's execs in request order, each with its results and how it closed."""
    tracker = ExecTracker()
    for f in frames:
        tracker.add(f)
    return tracker.execs
