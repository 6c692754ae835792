"""Pairing answers with their requests: exec, KV and interaction queries, by (segment, id).

The part of the frame walk (``facts.FactsBuilder``) that opens a request when the server sends an
exec, a KV call or an interaction query, and closes it when the client's answer with the same id
arrives, in either order: an answer seen before its request (a session imported in body order) is
kept and replayed when the request arrives. ``FactsBuilder`` mixes this in, so the handlers stay
plain bound methods in its per-kind dispatch table (no extra call per frame).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from google.protobuf.message import DecodeError

from workbench.analysis.records import ExecReq, KvOp, Query, SessionFacts
from workbench.schema import pb

# Message classes looked up once (pb's lookup is a dict walk per attribute access).
SERVER_CLS = pb.AgentServerMessage
CLIENT_CLS = pb.AgentClientMessage

def _member(cls: Any, payload: Any, name: str) -> Any:
    """The ``name`` member of an agent message of class ``cls``; None when the payload is not one."""
    try:
        return getattr(cls.FromString(payload or b""), name)
    except DecodeError:
        return None


_Item = TypeVar("_Item", ExecReq, KvOp, Query)  # a request waiting for its answer


class RequestPairing:
    """Handlers of exec/KV/query requests and their answers; ``FactsBuilder.__init__`` sets the state."""

    facts: SessionFacts
    _exec_open: dict[tuple[int, int], ExecReq]
    _kv_open: dict[tuple[int, int], KvOp]
    _query_open: dict[tuple[int, int], Query]
    # answers whose request has not been seen (yet): (what, seg, id) -> handler calls to replay
    _early: dict[tuple[str, int, int], list[tuple[Callable[..., None], tuple[Any, ...]]]]
    # requests still waiting for an answer, to count later server frames (live grace)
    _waiting: list[ExecReq | KvOp | Query]

    def _input(self, seq: int) -> None:
        """Record new client input at ``seq`` (``FactsBuilder`` implements it)."""
        raise NotImplementedError

    def _tick(self) -> None:
        keep = []
        for w in self._waiting:
            w.later_server += 1
            if w.later_server < 1_000:
                keep.append(w)
        self._waiting = keep

    def _defer(self, what: str, ref: Any, handler: Callable[..., None], args: tuple[Any, ...]) -> None:
        """Keep an answer whose request is not known (yet): replayed when the request arrives."""
        key = (what, self.facts.seg, int(ref))
        self._early.setdefault(key, []).append((handler, args))

    def _replay(self, what: str, seg: int, id_: int) -> None:
        for handler, args in self._early.pop((what, seg, id_), []):
            handler(*args)

    def _open(self, what: str, table: dict[tuple[int, int], _Item], records: list[_Item], id_: int,
              item: _Item) -> None:
        """A request arrived: recorded, it waits for its answer under (segment, id); answers seen first
        are replayed."""
        records.append(item)
        table[(self.facts.seg, id_)] = item
        self._waiting.append(item)
        self._replay(what, self.facts.seg, id_)

    def _takes_answer(self, answer_seq: int | None) -> bool:
        """Whether a request still takes an answer: it has none, or only one the server refused (a
        resend after a refused append replaces the refused answer)."""
        return answer_seq is None or answer_seq in self.facts.http_failures

    def _request_of(self, what: str, table: dict[tuple[int, int], _Item], ref: Any,
                    handler: Callable[..., None], args: tuple[Any, ...]) -> _Item | None:
        """The open request an answer refers to; None when the answer names none, or when its request
        has not arrived yet (the answer is then kept and replayed when it does)."""
        if ref is None:
            return None
        item = table.get((self.facts.seg, int(ref)))
        if item is None:
            self._defer(what, ref, handler, args)
        return item

    # handlers ---------------------------------------------------------------------------------

    def _on_exec(self, seq: int, ts: int, ref: Any, cid: Any, payload: Any, kind: str) -> None:
        msg = _member(SERVER_CLS, payload, "exec_server_message")
        if msg is None:
            return
        known = msg.WhichOneof("args")
        # A member the overlay lacks keeps the name the capture's schema gave its frame kind.
        member = known or (kind.split(".", 1)[1] if "." in kind else "unknown")
        tcid = None
        if known:
            args = getattr(msg, known)
            if hasattr(args, "DESCRIPTOR") and "tool_call_id" in args.DESCRIPTOR.fields_by_name:
                tcid = args.tool_call_id or None
        req = ExecReq(self.facts.seg, msg.id, seq, ts, member, msg.exec_id, tcid, payload or b"")
        self._open("exec", self._exec_open, self.facts.execs, msg.id, req)

    def _exec_for(self, ref: Any) -> ExecReq | None:
        if ref is None:
            return None
        return self._exec_open.get((self.facts.seg, int(ref)))

    def _on_exec_result(self, seq: int, ts: int, ref: Any, cid: Any, payload: Any, kind: str) -> None:
        req = self._request_of("exec", self._exec_open, ref, self._on_exec_result, (seq, ts, ref, cid, payload, kind))
        if req is None:
            return
        if not req.result_seqs:
            self._input(seq)  # the first answer to an exec is new work for the server
        req.result_seqs.append(seq)
        req.last_result = payload
        if req.result_payload is None:
            req.result_payload = payload
        if payload and len(req.echo_payloads) < 4:
            req.echo_payloads.append(payload)
        req.result_ts = ts
        self._done(req)

    def _on_exec_control(self, seq: int, ts: int, ref: Any, cid: Any, payload: Any, kind: str) -> None:
        req = self._exec_for(ref)
        member = kind.rsplit(".", 1)[-1]
        if req is None:
            if member in ("stream_close", "throw"):
                self.facts.throws_unmatched.append((seq, int(ref) if ref is not None else -1))
            if ref is not None:
                self._defer("exec", ref, self._on_exec_control, (seq, ts, ref, cid, payload, kind))
            return
        if member == "heartbeat":
            req.client_hb_seq = seq
        elif member == "stream_close":
            req.close_seq = seq
        elif member == "throw":
            req.throw_seq = seq
            control = _member(CLIENT_CLS, payload, "exec_client_control_message")
            if control is not None:
                req.throw_error = control.throw.error
            self._done(req)

    def _on_abort(self, seq: int, ts: int, ref: Any, cid: Any, payload: Any, kind: str) -> None:
        req = self._exec_for(ref)
        if req is not None:
            req.abort_seq = seq
            self._done(req)

    def _on_kv(self, seq: int, ts: int, ref: Any, cid: Any, payload: Any, kind: str) -> None:
        msg = _member(SERVER_CLS, payload, "kv_server_message")
        if msg is None:
            return
        member = msg.WhichOneof("args")
        if member == "set_blob_args":
            op = KvOp(self.facts.seg, msg.id, seq, "set", bytes(msg.set_blob_args.blob_id),
                      bytes(msg.set_blob_args.blob_data), ts=ts)
        elif member == "get_blob_args":
            op = KvOp(self.facts.seg, msg.id, seq, "get", bytes(msg.get_blob_args.blob_id), None, ts=ts)
        else:
            return
        self._open("kv", self._kv_open, self.facts.kv, msg.id, op)

    def _on_kv_result(self, seq: int, ts: int, ref: Any, cid: Any, payload: Any, kind: str) -> None:
        op = self._request_of("kv", self._kv_open, ref, self._on_kv_result, (seq, ts, ref, cid, payload, kind))
        if op is None:
            return
        if not self._takes_answer(op.result_seq):
            return
        msg = _member(CLIENT_CLS, payload, "kv_client_message")
        if msg is None:
            return
        op.result_seq = seq
        if op.ts and ts > op.ts:  # a KV answer needs no work on the client: its delay is the path's
            self.facts.kv_round_trip_us = max(self.facts.kv_round_trip_us, ts - op.ts)
        op.result_member = msg.WhichOneof("result")
        if op.result_member == "get_blob_result":
            op.result_has_data = msg.get_blob_result.HasField("blob_data")
            op.result_data = bytes(msg.get_blob_result.blob_data) if op.result_has_data else None
        elif op.result_member == "set_blob_result" and msg.set_blob_result.HasField("error"):
            op.set_error = msg.set_blob_result.error.message or "error"
        self._done(op)

    def _on_query(self, seq: int, ts: int, ref: Any, cid: Any, payload: Any, kind: str) -> None:
        if ref is None:
            return
        q = Query(self.facts.seg, int(ref), seq, kind)
        self._open("query", self._query_open, self.facts.queries, q.id, q)

    def _on_response(self, seq: int, ts: int, ref: Any, cid: Any, payload: Any, kind: str) -> None:
        q = self._request_of("query", self._query_open, ref, self._on_response, (seq, ts, ref, cid, payload, kind))
        if q is None:
            return
        if self._takes_answer(q.response_seq):
            q.response_seq = seq
            self._done(q)

    def _done(self, item: ExecReq | KvOp | Query) -> None:
        try:
            self._waiting.remove(item)
        except ValueError:
            pass
