"""Which client message answers which server message (docs/protocol.md §4).

The agent protocol pairs messages by ids, never by position:

- **exec**: ``exec_server_message{id, exec_id}`` is answered by one or more
  ``exec_client_message{id, exec_id}`` (a streamed shell sends several), optionally followed by
  ``exec_client_control_message.stream_close{id}``; ``throw{id}`` (usually followed by
  ``stream_close``) answers an exec the client cannot run. ``exec_client_control_message.heartbeat{id}``
  says a local exec is still running.
- **kv**: ``kv_server_message{id}`` (get_blob / set_blob) gets exactly one ``kv_client_message{id}``.
- **query**: ``interaction_query{id}`` gets exactly one ``interaction_response{id}``.
- **turn**: a follow-up on the same run (a later ``run_request``, or a ``conversation_action`` with a
  user message) is the client's answer to the ``turn_ended`` of the turn before.

Ids are only unique within one turn: a server may reuse exec 1 in the next turn. So answers are
grouped per id (an exec's results and its close form one group; a new group starts after a close or
after a follow-up) and the n-th group of an id answers the n-th request with that id. A request id
that repeats within one turn (no ``turn_ended`` between), or an answer for which no request is
left, means the pairing cannot be trusted: ``pair_messages`` then reports the problem instead.

The decoder fills ``ref_id`` with the numeric id of these messages; the string ``exec_id`` is read
from the payload. Callers pass anything with ``kind``, ``ref_id`` and ``payload`` attributes (a
``workbench.decode.classify.Frame``, a fixture frame, a row object); a live server holding parsed
messages asks ``client_message_correlation``.

Who pairs how:

- the importer (``workbench.ingest.causal``) pairs a whole recorded run with ``pair_messages`` and
  keeps body order when the ids cannot be trusted;
- the replay server (``workbench.fixtures.replay``) compares the client under test's messages with
  the recording by kind, ``family_of``'s id and ``exec_string_id_of``;
- the simulator (``workbench.sim.exec_completion``) waits for the answers to one exec it asked,
  with ``client_message_correlation``;
- analysis (``workbench.analysis.facts``) pairs *incrementally* (a live capture grows frame by
  frame, and a body-order import sends answers before their requests) and must go on when ids are
  broken (it reports them as findings instead of refusing), so it keys open requests by (run
  segment, family, id) and holds an early answer until its request comes: the same pairing as
  ``pair_messages`` whenever the latter finds no problem.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from google.protobuf.message import DecodeError

from workbench.protocol.kinds import (
    CLIENT_HEARTBEAT,
    EXEC_HEARTBEAT,
    FOLLOWUP_ACTION,
    RUN_REQUEST,
    SERVER_HEARTBEAT,
    TURN_ENDED,
    is_heartbeat,
)

# family of the server message that asks / the client message that answers, by top-level member
_SERVER_ASKS = {"exec_server_message": "exec", "kv_server_message": "kv", "interaction_query": "query"}
_CLIENT_ANSWERS = {"exec_client_message": "exec", "kv_client_message": "kv", "interaction_response": "query"}
# every member whose numeric id names a request of a family (control messages included)
_FAMILY = {**_SERVER_ASKS, **_CLIENT_ANSWERS, "exec_client_control_message": "exec",
           "exec_server_control_message": "exec"}
# families whose requests get exactly one reply
ONE_REPLY = frozenset({"kv", "query"})


class FrameLike(Protocol):
    @property
    def kind(self) -> str: ...

    @property
    def ref_id(self) -> int | None: ...

    @property
    def payload(self) -> bytes: ...


@dataclass(frozen=True, slots=True)
class Correlation:
    """What one message means for pairing.

    ``role``: ``request`` (the server asks), ``answer`` (a result), ``throw`` (the client cannot run
    it), ``close`` (stream_close: ends the answers to that exec), ``progress`` (an exec heartbeat:
    the exec still runs).
    """

    family: str
    id: int
    role: str
    exec_id: str | None = None


def _top(kind: str) -> str:
    return kind.split(".", 1)[0]


def family_of(kind: str) -> str | None:
    """``exec`` | ``kv`` | ``query`` for a message whose numeric id names such a request (results,
    control messages and the server's requests alike), else None."""
    return _FAMILY.get(_top(kind))


def exec_string_id_of(kind: str, payload: bytes | None) -> str | None:
    """The string ``exec_id`` of an exec request or result (both must carry the same one)."""
    top = _top(kind)
    if top not in ("exec_server_message", "exec_client_message") or not payload:
        return None
    # protocol/ stays light for the capture addon: the schema (protobuf) loads when a message is parsed
    from workbench.schema import pb

    try:
        if top == "exec_server_message":
            value = pb.AgentServerMessage.FromString(payload).exec_server_message.exec_id
        else:
            value = pb.AgentClientMessage.FromString(payload).exec_client_message.exec_id
    except DecodeError:
        return None
    return str(value) or None


def server_correlation(f: FrameLike) -> Correlation | None:
    """The request a server message makes (None: it asks nothing)."""
    family = _SERVER_ASKS.get(_top(f.kind))
    if family is None or f.ref_id is None:
        return None
    return Correlation(family, int(f.ref_id), "request",
                       exec_string_id_of(f.kind, f.payload) if family == "exec" else None)


def client_correlation(f: FrameLike) -> Correlation | None:
    """The request a client message answers (None: it answers none)."""
    kind = f.kind
    top = _top(kind)
    if f.ref_id is None:
        return None
    family = _CLIENT_ANSWERS.get(top)
    if family is not None:
        return Correlation(family, int(f.ref_id), "answer",
                           exec_string_id_of(kind, f.payload) if family == "exec" else None)
    if top == "exec_client_control_message":
        member = kind.rsplit(".", 1)[-1]
        if member == "stream_close":
            return Correlation("exec", int(f.ref_id), "close")
        if member == "throw":  # Cursor's own executor follows it with stream_close
            return Correlation("exec", int(f.ref_id), "throw")
        if member == "heartbeat":
            return Correlation("exec", int(f.ref_id), "progress")
    return None


_CONTROL_ROLES = {"stream_close": "close", "throw": "throw", "heartbeat": "progress"}


def client_message_correlation(msg: Any) -> Correlation | None:
    """The request a parsed ``AgentClientMessage`` answers (None: it answers none); the same
    classification as ``client_correlation`` for a server that holds messages, not frames."""
    top = msg.WhichOneof("message")
    family = _CLIENT_ANSWERS.get(top or "")
    if family is not None:
        sub = getattr(msg, top)
        return Correlation(family, int(sub.id), "answer", (str(sub.exec_id) or None) if family == "exec" else None)
    if top == "exec_client_control_message":
        ctl = msg.exec_client_control_message
        member = ctl.WhichOneof("message")
        role = _CONTROL_ROLES.get(member or "")
        if role is not None:
            return Correlation("exec", int(getattr(ctl, member).id), role)
    return None


def is_followup(kind: str) -> bool:
    """A client message that starts a new turn on an open run (after the first run_request)."""
    return kind in (RUN_REQUEST, FOLLOWUP_ACTION)


@dataclass
class Pairing:
    """The outcome of ``pair_messages``.

    ``answers[i]`` is the index of the server message client message ``i`` answers, ``START`` for
    the message that opens the run (the first ``run_request``, or anything before it), or ``None``
    for a message that answers nothing (heartbeats, cancel, unknown kinds). ``problem`` is set when
    the ids do not allow a trustworthy pairing (then ``answers`` is incomplete).
    """

    answers: list[int | None] = field(default_factory=list)
    problem: str | None = None
    # server index → client indexes answering it (for callers that walk requests)
    answered_by: dict[int, list[int]] = field(default_factory=dict)


START = -1


def _label(c: Correlation) -> str:
    return f"{c.family} {c.id}"


def pair_messages(server: Sequence[FrameLike], client: Sequence[FrameLike]) -> Pairing:
    """Pair every client message of one run with the server message it answers.

    ``server`` and ``client`` are each in their own wire order (the order of their bodies).
    """
    out = Pairing([None] * len(client))
    requests: dict[tuple[str, int], list[int]] = {}
    request_of: dict[int, Correlation] = {}
    turn_ends: list[int] = []
    for j, f in enumerate(server):
        if f.kind == TURN_ENDED:
            turn_ends.append(j)
            continue
        c = server_correlation(f)
        if c is None:
            continue
        seen = requests.setdefault((c.family, c.id), [])
        if seen and not any(seen[-1] < t < j for t in turn_ends):
            out.problem = (f"server message {j} repeats {_label(c)} within one turn (also at {seen[-1]}): "
                           f"answers cannot be paired by id")
            return out
        seen.append(j)
        request_of[j] = c

    groups_used: dict[tuple[str, int], int] = {}
    open_group: dict[tuple[str, int], tuple[int, int]] = {}  # key → (server index, turn it was opened in)
    turn = 0
    # Without a run_request (e.g. its BidiAppend is missing) every message is paired as it comes.
    started = not any(f.kind == RUN_REQUEST for f in client)
    followups = 0
    for i, f in enumerate(client):
        kind = f.kind
        if not started:
            out.answers[i] = START
            if kind == RUN_REQUEST:
                started = True
            continue
        if is_followup(kind):
            if followups >= len(turn_ends):
                out.problem = (f"client message {i} ({kind}) starts turn {followups + 2} but the server ended "
                               f"only {len(turn_ends)} turn(s) before it")
                return out
            out.answers[i] = turn_ends[followups]
            followups += 1
            turn += 1
            continue
        c = client_correlation(f)
        if c is None:
            continue
        key = (c.family, c.id)
        current = open_group.get(key)
        if c.family in ONE_REPLY or current is None or current[1] != turn:
            n = groups_used.get(key, 0)
            candidates = requests.get(key, [])
            if n >= len(candidates):
                what = "answers" if c.role == "answer" else f"sends {kind.rsplit('.', 1)[-1]} for"
                why = (f"again, but the server asked only {len(candidates)} time(s)" if candidates
                       else "which the server never asked")
                out.problem = f"client message {i} ({kind}) {what} {_label(c)} {why}"
                return out
            groups_used[key] = n + 1
            current = (candidates[n], turn)
            if c.family not in ONE_REPLY:
                open_group[key] = current
        target = current[0]
        out.answers[i] = target
        out.answered_by.setdefault(target, []).append(i)
        if c.role == "close":
            open_group.pop(key, None)
    return out


__all__ = ["CLIENT_HEARTBEAT", "EXEC_HEARTBEAT", "FOLLOWUP_ACTION", "ONE_REPLY", "RUN_REQUEST", "SERVER_HEARTBEAT",
           "START", "TURN_ENDED", "Correlation", "FrameLike", "Pairing", "client_correlation",
           "client_message_correlation", "exec_string_id_of", "family_of", "is_followup", "is_heartbeat",
           "pair_messages", "server_correlation"]
