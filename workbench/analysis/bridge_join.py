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
from typing import Any

from workbench.protocol import kinds
from workbench.protocol.labels import prompt_of
from workbench.protocol.openai import RequestFacts, request_facts
from workbench.protocol.routes import OPENAI_TRANSPORTS

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


def _rows(src: Any, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    return list(src.query(sql, list(params)).to_pylist())


def _session(src: Any, sid: str) -> dict[str, Any] | None:
    rows = _rows(src, "SELECT session_id, transport, status, model, conversation_id, epoch_us(started_at) AS start_us, "
                      "epoch_us(ended_at) AS end_us, (SELECT max(epoch_us(ts)) FROM frames f WHERE f.session_id = s.session_id) "
                      "AS last_us FROM sessions s WHERE session_id = ?", [sid])
    return rows[0] if rows else None


def has_bridge_sessions(src: Any) -> bool:
    """Any OpenAI session in the database at all (the join costs nothing when there is none)."""
    return bool(src.query("SELECT count(*) FROM sessions WHERE transport IN (SELECT unnest(?))",
                          [list(JOINED)]).column(0)[0].as_py())


def request_payload(src: Any, sid: str) -> bytes | None:
    rows = _rows(src, "SELECT payload FROM frames WHERE session_id = ? AND kind = ? ORDER BY seq LIMIT 1",
                 [sid, kinds.OPENAI_REQUEST])
    return rows[0]["payload"] if rows else None


def _prompt(src: Any, sid: str) -> str:
    rows = _rows(src, "SELECT kind, payload FROM frames WHERE session_id = ? AND direction = 'client' AND kind = ? "
                      "ORDER BY seq LIMIT 1", [sid, kinds.RUN_REQUEST])
    return (prompt_of(rows[0]["kind"], rows[0]["payload"]) or "") if rows else ""


def _call_ids(src: Any, sids: Iterable[str], directions: tuple[str, ...] = ("server",)) -> dict[str, set[str]]:
    ids = list(sids)
    out: dict[str, set[str]] = {s: set() for s in ids}
    if not ids:
        return out
    for r in _rows(src, "SELECT DISTINCT session_id, call_id FROM frames WHERE session_id IN (SELECT unnest(?)) "
                        "AND call_id IS NOT NULL AND direction IN (SELECT unnest(?))", [ids, list(directions)]):
        out[r["session_id"]].add(str(r["call_id"]))
    return out


def _window(s: dict[str, Any]) -> tuple[int, int]:
    start = int(s["start_us"] or 0)
    end = s["end_us"] or s["last_us"] or start
    return start, max(int(end), int(s["last_us"] or 0))


def openai_links(src: Any, sid: str, answered: bool = True) -> list[Link]:
    """The agent runs an OpenAI request caused (and, with ``answered``, the runs whose tool calls it
    answers)."""
    o = _session(src, sid)
    if o is None or o["transport"] not in JOINED:
        return []
    facts = request_facts(request_payload(src, sid)) or RequestFacts()
    start, end = _window(o)
    during = _rows(src, "SELECT session_id, model FROM sessions WHERE transport IN (SELECT unnest(?)) "
                        "AND epoch_us(started_at) BETWEEN ? AND ? ORDER BY started_at", [list(AGENT_TRANSPORTS), start, end])
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


def _asked(src: Any, sid: str, facts: RequestFacts, caused: set[str]) -> list[Link]:
    """Runs whose tool calls this request answers: by the call id in the run's own frames, or (a
    bridge that renames ids) through the earlier OpenAI answer that handed the id to the client."""
    ids = sorted(facts.tool_results)
    if not ids:
        return []
    found: dict[str, Link] = {}
    for r in _rows(src, "SELECT DISTINCT session_id FROM frames WHERE call_id IN (SELECT unnest(?)) AND transport IN "
                        "(SELECT unnest(?))", [ids, list(AGENT_TRANSPORTS)]):
        found[r["session_id"]] = Link(r["session_id"], "asked", ["tool_call_id"])
    for r in _rows(src, "SELECT DISTINCT session_id FROM frames WHERE call_id IN (SELECT unnest(?)) AND transport IN "
                        "(SELECT unnest(?)) AND session_id <> ?", [ids, list(OPENAI_TRANSPORTS), sid]):
        for lk in openai_links(src, r["session_id"], answered=False):  # (one step back, not the whole chain)
            if lk.role == "caused" and lk.session_id not in found:
                found[lk.session_id] = Link(lk.session_id, "asked", ["tool_call_id", "earlier_answer"])
    return [lk for s, lk in found.items() if s not in caused]


def agent_links(src: Any, sid: str) -> list[Link]:
    """The OpenAI requests linked to an agent run (each link as the OpenAI side sees it)."""
    a = _session(src, sid)
    if a is None or a["transport"] not in AGENT_TRANSPORTS:
        return []
    start = int(a["start_us"] or 0)
    cands = _rows(src, "SELECT session_id FROM sessions s WHERE transport IN (SELECT unnest(?)) AND "
                       "epoch_us(started_at) <= ? AND coalesce(epoch_us(ended_at), ?) >= ?",
                  [list(JOINED), start, start, start])
    ids = {c["session_id"] for c in cands}
    mine = _call_ids(src, [sid]).get(sid, set())
    for call_id in sorted(mine)[:50]:  # follow-ups answering this run's tool calls, whenever they came after it
        for r in _rows(src, "SELECT DISTINCT f.session_id FROM frames f JOIN sessions s USING (session_id) "
                            "WHERE f.kind = ? AND s.transport IN (SELECT unnest(?)) AND epoch_us(s.started_at) >= ? "
                            "AND contains(CAST(f.payload AS VARCHAR), ?)", [kinds.OPENAI_REQUEST, list(JOINED), start,
                                                                          call_id]):
            facts = request_facts(request_payload(src, r["session_id"]))
            if facts is not None and call_id in facts.tool_results:
                ids.add(r["session_id"])
    out = []
    for o in sorted(ids):
        for lk in openai_links(src, o):
            if lk.session_id == sid:
                out.append(Link(o, lk.role, lk.by))
    return out


def links_of(src: Any, sid: str) -> list[Link]:
    """Links of a session on either side ([] for any other session, or when no OpenAI side was recorded)."""
    if not has_bridge_sessions(src):
        return []
    return openai_links(src, sid) + agent_links(src, sid)


def store_links(store: Any, session_ids: Sequence[str]) -> None:
    """Store the links of these sessions (and of the sessions on their other side) in ``meta``."""
    if not session_ids or not has_bridge_sessions(store):
        return
    todo = {sid: links_of(store, sid) for sid in session_ids}
    for links in list(todo.values()):
        for lk in links:
            if lk.session_id not in todo:
                todo[lk.session_id] = links_of(store, lk.session_id)
    rows = [[LINKS_PREFIX + sid, json.dumps([lk.as_dict() for lk in links])] for sid, links in todo.items() if links]
    gone = [LINKS_PREFIX + sid for sid, links in todo.items() if not links]
    with store.transaction():
        if gone:
            store.con.execute("DELETE FROM meta WHERE key IN (SELECT unnest(?))", [gone])
        if rows:
            store.con.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", rows)


def stored_links(src: Any, session_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """session id → its stored links (sessions with none are absent)."""
    out: dict[str, list[dict[str, Any]]] = {}
    if not session_ids:
        return out
    keys = [LINKS_PREFIX + s for s in session_ids]
    for r in _rows(src, "SELECT key, value FROM meta WHERE key IN (SELECT unnest(?))", [keys]):
        try:
            value = json.loads(r["value"])
        except ValueError:
            continue
        if isinstance(value, list):
            out[r["key"][len(LINKS_PREFIX):]] = value
    return out


def listing_links(src: Any, session_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """Links of listed sessions: the stored ones, computed for bridge sessions nobody stored yet
    (a capture in progress, a file written before links were stored)."""
    if not session_ids or not has_bridge_sessions(src):
        return {}
    out = stored_links(src, session_ids)
    kinds_of = {r["session_id"]: r["transport"] for r in _rows(
        src, "SELECT session_id, transport FROM sessions WHERE session_id IN (SELECT unnest(?))", [list(session_ids)])}
    for sid in session_ids:
        if sid not in out and kinds_of.get(sid) in (*JOINED, *AGENT_TRANSPORTS):
            found = links_of(src, sid)
            if found:
                out[sid] = [lk.as_dict() for lk in found]
    return out
