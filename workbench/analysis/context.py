"""What every rule reads (``Context``), the rule registry, and the shared test for harm: a stall.

A rule reports a missing obligation (an exec result, a stream_close, a KV answer, an
interaction_response) only when the run shows the harm: after it, the server made no progress
and the turn never ended, and the server kept the stream alive with heartbeats only (or ended it
with a timeout). A turn that completed anyway, or a client that left the run on purpose before
the server parked, is not a fault of that obligation. docs/analysis.md states this per rule.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from workbench.analysis.model import Config, Finding, Severity
from workbench.analysis.records import EndStream, ExecReq, HeartbeatRun, SessionFacts
from workbench.analysis.rows import BlobRow, CallRecord, SessionRecord
from workbench.decode.classify import default_decoder
from workbench.protocol import kinds
from workbench.protocol.status import StreamError, parse_stream_error

# Session meta "order": how the frames of a session were put in sequence.
ORDER_TIME = "time"        # as they crossed the wire (captures, client recordings)
ORDER_CAUSAL = "causal"    # rebuilt from the protocol (imports without per-frame timing)
ORDER_BODY = "body"        # body order of each HTTP message: the interleaving is unknown
ORDER_NOTE = ("Frame order unknown (imported without per-frame timing; client and server frames are in body "
              "order), so what came first is a guess: ")


def session_order(meta: Mapping[str, object] | None) -> str:
    """The order of a session's frames from its ``sessions.meta``."""
    meta = meta or {}
    order = meta.get("order")
    if order in (ORDER_TIME, ORDER_CAUSAL, ORDER_BODY):
        return str(order)
    # Imports written before "order" existed kept body order and said so with their timing note.
    return ORDER_BODY if meta.get("timing") == "per-message" else ORDER_TIME


@dataclass
class Stall:
    """Evidence that a run parked after some point: heartbeats only, no turn_ended."""

    heartbeats: int
    sample: list[int]           # a few heartbeat seqs (head and last)
    timeout_seq: int | None     # an end-stream error that says the server gave up waiting

    def describe(self) -> str:
        bits = []
        if self.heartbeats:
            bits.append(f"{self.heartbeats} heartbeat-only frame{'s' if self.heartbeats != 1 else ''} followed")
        if self.timeout_seq is not None:
            bits.append(f"the server gave up waiting (deadline_exceeded at seq {self.timeout_seq})")
        return " and ".join(bits) + ", no progress and no turn_ended"

    @property
    def evidence(self) -> list[int]:
        return self.sample + ([self.timeout_seq] if self.timeout_seq is not None else [])


@dataclass
class Context:
    facts: SessionFacts
    blobs: list[BlobRow]
    tool_calls: list[CallRecord]
    config: Config
    final: bool
    runs: list[HeartbeatRun]
    # a checkpoint this conversation received in an earlier session: (session_id, seq)
    prior_checkpoint: tuple[str, int] | None = None
    session: SessionRecord = field(default_factory=lambda: SessionRecord())
    # the user text of that earlier session's first run_request (a stateless client's history)
    prior_prompt: str | None = None
    # (session_id, seq, payload) of run requests and actions of later sessions, read on first use
    later: Callable[[], list[tuple[str, int, bytes]]] | None = None
    # tool-call ids of this run whose results a bridge sent in a linked follow-up run, read on first
    # use (analysis/bridge_handoff.py; None: no OpenAI side recorded)
    follow_ups: Callable[[], set[str]] | None = None
    # the session is the only one of its conversation: no later session can carry a follow-up
    alone: bool = False
    _errors: dict[int, StreamError | None] = field(default_factory=dict)
    _follow_up_ids: set[str] | None = None

    @property
    def session_id(self) -> str:
        return self.facts.session_id

    @property
    def order(self) -> str:
        return session_order(self.session.get("meta"))

    @property
    def order_known(self) -> bool:
        return self.order != ORDER_BODY

    def finding(self, code: str, message: str, evidence: Sequence[int | None], fix: str,
                severity: Severity | None = None, *, order_dependent: bool = False) -> Finding:
        """A finding of ``code``. ``order_dependent``: the conclusion rests on which frame came
        first; in a body-order session it is then stated as a possibility, as a warning."""
        ev = [int(s) for s in evidence if s is not None]
        sev: Severity = severity or RULES[code].severity
        if order_dependent and not self.order_known:
            message = ORDER_NOTE + message
            sev = "warning" if sev == "error" else sev  # lowered, never raised (a note stays a note)
        return Finding(code, sev, message, min(ev) if ev else None, max(ev) if ev else None, tuple(ev), fix,
                       self.session_id)

    # positions -------------------------------------------------------------------------------

    def seg_of(self, seq: int) -> int:
        return bisect_right(self.facts.seg_starts, seq)

    def seg_end(self, seg: int) -> int | None:
        """The seq of the run_request that starts the next segment (None: the last one)."""
        starts = self.facts.seg_starts
        return starts[seg] if seg < len(starts) else None

    @staticmethod
    def _between(seqs: list[int], lo: int, hi: int | None) -> list[int]:
        i = bisect_right(seqs, lo)
        j = len(seqs) if hi is None else bisect_left(seqs, hi)
        return seqs[i:j]

    def turn_ended_between(self, lo: int, hi: int | None) -> list[int]:
        return self._between([s for s, _seg in self.facts.turn_ended], lo, hi)

    def text_between(self, lo: int, hi: int | None) -> list[int]:
        return self._between(self.facts.text_seqs, lo, hi)

    def heartbeats_between(self, lo: int, hi: int | None) -> int:
        seqs = self.facts.heartbeat_seqs
        i = bisect_right(seqs, lo)
        j = len(seqs) if hi is None else bisect_left(seqs, hi)
        return max(0, j - i)

    def heartbeat_sample(self, lo: int, hi: int | None, n: int = 6) -> list[int]:
        seqs = self.facts.heartbeat_seqs
        i = bisect_right(seqs, lo)
        j = len(seqs) if hi is None else bisect_left(seqs, hi)
        if j <= i:
            return []
        return seqs[i:min(j, i + n)] + [seqs[j - 1]]

    def run_after(self, seq: int) -> HeartbeatRun | None:
        """The first heartbeat stretch starting after ``seq``."""
        for run in self.runs:
            if run.first_seq > seq:
                return run
        return None

    def settled(self, seq: int) -> bool:
        """True when enough later frames exist to call a missing answer missing."""
        if self.final:
            return True
        last = self.facts.last_seq if self.facts.last_seq is not None else seq
        return last - seq >= self.config.live_grace_frames

    # harm ------------------------------------------------------------------------------------

    def moved_on(self, ref: int, seg: int, *, any_progress: bool = False) -> bool:
        """Did the server move past ``ref`` in its segment? ``any_progress``: any server frame but
        heartbeats, KV and the end counts; otherwise only what shows the model went on (text,
        thinking, tokens, steps, checkpoint, turn_ended, a new tool call)."""
        end = self.seg_end(seg)
        last = (self.facts.seg_last_any if any_progress else self.facts.seg_last_gen).get(seg)
        if last is not None and last > ref:
            return True
        if any_progress:
            return False
        return any(ref < c.first_seq and (end is None or c.first_seq < end) for c in self.facts.calls.values())

    def stall_after(self, ref: int, seg: int, *, any_progress: bool = False) -> Stall | None:
        """Evidence that the run parked after ``ref``: no turn_ended and no progress in its segment,
        then heartbeats (at least one in a finished session, ``heartbeat_min_count`` while live) or an
        end-stream saying the server gave up waiting."""
        end = self.seg_end(seg)
        if self.turn_ended_between(ref, end) or self.moved_on(ref, seg, any_progress=any_progress):
            return None
        beats = self.heartbeats_between(ref, end)
        timeout = next((e.seq for e in self.end_streams_between(ref, end)
                        if kinds.is_end_stream_error(e.kind) and self.stream_error(e) is not None
                        and self.stream_error(e).code == "deadline_exceeded"), None)  # type: ignore[union-attr]
        need = 1 if self.final else max(1, self.config.heartbeat_min_count)
        if beats >= need or timeout is not None:
            return Stall(beats, self.heartbeat_sample(ref, end), timeout)
        return None

    def handed_off(self, req: ExecReq) -> bool:
        """The client closed the run right after an exec it did not answer, before the server
        parked (no heartbeat since): the fresh-run flow of a proxy that hands the exec to its own
        caller and continues in a new run with the history. Not a stall. A run left open (or
        closed late) counts too once its exec was answered in a linked follow-up run."""
        if self.answered_in_follow_up(req):
            return True
        if not self.final or self.session.get("status") == "error":
            return False
        end = self.seg_end(req.seg)
        if self.heartbeats_between(req.seq, end):
            return False
        return not self.turn_ended_between(req.seq, end) and not self.moved_on(req.seq, req.seg)

    def answered_in_follow_up(self, req: ExecReq) -> bool:
        """A bridge handed this exec's tool call to its OpenAI client, left the run and sent the
        result in a linked follow-up run (``bridge_left_run`` says so): answered, just not here."""
        if self.follow_ups is None or not req.tool_call_id:
            return False
        if self._follow_up_ids is None:
            self._follow_up_ids = self.follow_ups()
        return req.tool_call_id in self._follow_up_ids

    def later_payloads(self) -> list[tuple[str, int, bytes]]:
        """(session_id, seq, payload) of run requests and actions in sessions that started later."""
        return self.later() if self.later is not None else []

    def delivered(self, seq: int | None) -> bool:
        """False for a client frame whose exchange was answered non-2xx (the server never took it)."""
        return seq is not None and seq not in self.facts.http_failures

    # end of stream ---------------------------------------------------------------------------

    def end_streams_between(self, lo: int, hi: int | None) -> list[EndStream]:
        return [e for e in self.facts.end_streams if e.seq > lo and (hi is None or e.seq < hi)]

    def stream_error(self, end: EndStream) -> StreamError | None:
        """The parsed error of an end-stream (None when clean or unparseable)."""
        if end.seq not in self._errors:
            err: StreamError | None = None
            if kinds.is_end_stream_error(end.kind):
                try:
                    err = parse_stream_error(end.payload, end.flags, default_decoder().error_details)
                except ValueError:
                    err = None
            self._errors[end.seq] = err
        return self._errors[end.seq]


RuleFn = Callable[[Context], list[Finding]]


@dataclass(frozen=True)
class Rule:
    code: str
    severity: Severity  # the usual severity; a rule may lower it for a milder variant
    fn: RuleFn
    summary: str


RULES: dict[str, Rule] = {}


def rule(code: str, severity: Severity, summary: str) -> Callable[[RuleFn], RuleFn]:
    def wrap(fn: RuleFn) -> RuleFn:
        RULES[code] = Rule(code, severity, fn, summary)
        return fn
    return wrap


def exec_label(req: ExecReq) -> str:
    ex = f", exec_id {req.exec_id}" if req.exec_id else ""
    return f"exec {req.id} ({req.member}{ex})"
