"""Joining the two sides of a bridge: each OpenAI request to the agent run(s) it caused or answered.

A bridge (an OpenAI-compatible server in front of the agent service) turns one OpenAI request into
one agent run, or continues a run; recorded by one capture, both sides are sessions of the same
database (``openai_chat`` / ``openai_responses`` and ``run`` / ``runsse`` / ``runpoll``). They are
linked by what the traffic carries, and each link says how (``by``):

- ``time``: the run started while the request was open (after its headers, before its answer ended);
- ``prompt``: the run's ``run_request`` carries the request's newest user text;
- ``tool_result``: the run's ``run_request`` carries a tool result (or its call id) that the request
  sends back (a bridge that starts a fresh run per follow-up flattens the history into the prompt);
- ``tool_call_id``: a tool-call id the client received in the answer is one the run streamed, or
  one the request answers was streamed by the run (role ``asked``: the run that asked for it);
- ``model``: the same model name on both sides (only ever a tie-breaker).

A link has a ``role`` seen from the OpenAI side: ``caused`` (the run this request started or
continued) or ``asked`` (an earlier run whose tool call this request answers). Links are stored in
the ``meta`` table, ``('links:<session_id>', JSON list)``, one entry per session on the other side
(``{"session_id", "role", "by"}``); no schema change, like the analysis stamps (``stamp.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from workbench.protocol import kinds
from workbench.protocol.labels import prompt_of
from workbench.protocol.openai import RequestFacts, request_facts
from workbench.protocol.routes import OPENAI_TRANSPORTS
from workbench.store import bridge_reads as reads
from workbench.store.analysis_reads import first_payload, stamp_values
from workbench.store.queries import Reader, Row

if TYPE_CHECKING:  # annotations only: `workbench sessions` lists links and loads no pyarrow
    from workbench.store.db import Store

AGENT_TRANSPORTS = ("run", "runsse", "runpoll")
LINKS_PREFIX = "links:"
# Requests of these transports are translated into runs (a /v1/models listing causes none).
JOINED = ("openai_chat", "openai_responses")


@dataclass
class Link:
    session_id: str
    role: str                     # caused | asked (seen from the OpenAI side)
    by: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def has_bridge_sessions(src: Reader) -> bool:
    """Any OpenAI session in the database at all (the join costs nothing when there is none)."""
    return reads.has_sessions_of(src, JOINED)


def request_payload(src: Reader, sid: str) -> bytes | None:
    return first_payload(src, sid, kinds.OPENAI_REQUEST)


def _prompt(src: Reader, sid: str) -> str:
    payload = first_payload(src, sid, kinds.RUN_REQUEST)
    return (prompt_of(kinds.RUN_REQUEST, payload) or "") if payload is not None else ""


def _call_ids(src: Reader, sids: Iterable[str], directions: tuple[str, ...] = ("server",)) -> dict[str, set[str]]:
    ids = list(sids)
    out: dict[str, set[str]] = {s: set() for s in ids}
    for sid, call_id in reads.call_ids_of(src, ids, directions):
        out[sid].add(call_id)
    return out


def _window(s: Row) -> tuple[int, int]:
    start = int(s["start_us"] or 0)
    end = s["end_us"] or s["last_us"] or start
    return start, max(int(end), int(s["last_us"] or 0))


def openai_links(src: Reader, sid: str, answered: bool = True) -> list[Link]:
    """The agent runs an OpenAI request caused (and, with ``answered``, the runs whose tool calls it
    answers)."""
    o = reads.session_window(src, sid)
    if o is None or o["transport"] not in JOINED:
        return []
    facts = request_facts(request_payload(src, sid)) or RequestFacts()
    start, end = _window(o)
    during = reads.sessions_started_between(src, AGENT_TRANSPORTS, start, end)
    received = _call_ids(src, [sid]).get(sid, set())
    agent_calls = _call_ids(src, [r["session_id"] for r in during])
    links: list[Link] = []
    for r in during:
        by = ["time"]
        prompt = _prompt(src, r["session_id"])
        if facts.last_user and not facts.tool_results_last and facts.last_user.strip() in prompt:
            by.append("prompt")
        if facts.tool_results_last and any(cid in prompt or (text.strip() and text.strip() in prompt)
                                           for cid, text in facts.tool_results.items()):
            by.append("tool_result")
        if received & agent_calls[r["session_id"]]:
            by.append("tool_call_id")
        if facts.model and r["model"] == facts.model:
            by.append("model")
        links.append(Link(r["session_id"], "caused", by))
    strong = [lk for lk in links if len(set(lk.by) - {"time", "model"}) > 0]
    if strong:
        links = strong
    elif len(links) > 1:  # time alone cannot tell several runs apart: keep the model's, if that decides
        same = [lk for lk in links if "model" in lk.by]
        links = same if len(same) == 1 else links
    if answered:
        links += _asked(src, sid, facts, {lk.session_id for lk in links})
    return links


def _asked(src: Reader, sid: str, facts: RequestFacts, caused: set[str]) -> list[Link]:
    """Runs whose tool calls this request answers: by the call id in the run's own frames, or (a
    bridge that renames ids) through the earlier OpenAI answer that handed the id to the client."""
    ids = sorted(facts.tool_results)
    if not ids:
        return []
    found: dict[str, Link] = {}
    for run in reads.sessions_with_call_ids(src, ids, AGENT_TRANSPORTS):
        found[run] = Link(run, "asked", ["tool_call_id"])
    for earlier in reads.sessions_with_call_ids(src, ids, OPENAI_TRANSPORTS, exclude=sid):
        for lk in openai_links(src, earlier, answered=False):  # (one step back, not the whole chain)
            if lk.role == "caused" and lk.session_id not in found:
                found[lk.session_id] = Link(lk.session_id, "asked", ["tool_call_id", "earlier_answer"])
    return [lk for s, lk in found.items() if s not in caused]


def agent_links(src: Reader, sid: str) -> list[Link]:
    """The OpenAI requests linked to an agent run (each link as the OpenAI side sees it)."""
    a = reads.session_window(src, sid)
    if a is None or a["transport"] not in AGENT_TRANSPORTS:
        return []
    start = int(a["start_us"] or 0)
    ids = set(reads.sessions_open_at(src, JOINED, start))
    mine = _call_ids(src, [sid]).get(sid, set())
    for call_id in sorted(mine)[:50]:  # follow-ups answering this run's tool calls, whenever they came after it
        for o in reads.sessions_whose_frame_mentions(src, kinds.OPENAI_REQUEST, call_id, JOINED, start):
            facts = request_facts(request_payload(src, o))
            if facts is not None and call_id in facts.tool_results:
                ids.add(o)
    out = []
    for o in sorted(ids):
        for lk in openai_links(src, o):
            if lk.session_id == sid:
                out.append(Link(o, lk.role, lk.by))
    return out


def links_of(src: Reader, sid: str) -> list[Link]:
    """Links of a session on either side ([] for any other session, or when no OpenAI side was recorded)."""
    if not has_bridge_sessions(src):
        return []
    return openai_links(src, sid) + agent_links(src, sid)


def store_links(store: Store, session_ids: Sequence[str]) -> None:
    """Store the links of these sessions (and of the sessions on their other side) in ``meta``."""
    if not session_ids or not has_bridge_sessions(store):
        return
    todo = {sid: links_of(store, sid) for sid in session_ids}
    for links in list(todo.values()):
        for lk in links:
            if lk.session_id not in todo:
                todo[lk.session_id] = links_of(store, lk.session_id)
    # a session whose links are gone (none found any more) loses its stored ones
    reads.write_meta_values(store, LINKS_PREFIX, {sid: json.dumps([lk.as_dict() for lk in links]) if links else None
                                                  for sid, links in todo.items()})


def stored_links(src: Reader, session_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """session id → its stored links (sessions with none are absent)."""
    out: dict[str, list[dict[str, Any]]] = {}
    if not session_ids:
        return out
    for sid, text in stamp_values(src, LINKS_PREFIX, session_ids).items():
        try:
            value = json.loads(text)
        except ValueError:
            continue
        if isinstance(value, list):
            out[sid] = value
    return out


def listing_links(src: Reader, session_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """Links of listed sessions: the stored ones, computed for bridge sessions nobody stored yet
    (a capture in progress, a file written before links were stored)."""
    if not session_ids or not has_bridge_sessions(src):
        return {}
    out = stored_links(src, session_ids)
    kinds_of = reads.transports_by_start(src, session_ids)
    for sid in session_ids:
        if sid not in out and kinds_of.get(sid) in (*JOINED, *AGENT_TRANSPORTS):
            found = links_of(src, sid)
            if found:
                out[sid] = [lk.as_dict() for lk in found]
    return out
