"""Sessions of a packet capture written while tshark still reads it.

tshark dissects on one core while the importer reads its output on another; the importer's own
work (decoding, ordering, writing) used to begin only once tshark had finished. An HTTP/2 ``Run``
is a session of its own (it carries its own requests; BidiAppends join only RunSSE/RunPoll), so
once its TCP connection has ended (both FINs, or an RST) the session can be decoded and written
at once. Everything else waits for the end of the capture, as before.

What is stored must be what the import would store reading the whole capture first, so each
early session is checked at the end and taken back (``PlanWriter.unwrite``) and imported with the
rest when it could differ:

- a packet after the connection's end changed what its exchange looks like once settled (each
  early exchange is settled on a copy; the copy's fingerprint is compared with the exchange
  settled at the end, when all packets are in);
- another exchange of the capture has the same session or unit (a connection seen twice):
  which one is written depends on the order of the whole capture;
- the session was not new or plainly already imported (a rebuild or a conflict deletes or
  warns): such a plan is never written early.

One thing follows completion order instead of request order: when the import-wide inflate budget
(``--inflate-import-mb``) runs out, the sessions decoded first get the inflated frames.
"""

from __future__ import annotations

import copy
import hashlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from workbench.ingest.exchange_import import ExchangeImport, ExchangeImporter
from workbench.ingest.identity import SessionPlan
from workbench.ingest.pcap_streams import Connection, Reassembler, WireExchange, settle
from workbench.ingest.progress import Progress
from workbench.ingest.tshark import Packet
from workbench.protocol.status import STREAM_TRANSPORTS

if TYPE_CHECKING:
    from workbench.analysis.ahead import FindingsAhead


# How long each moment the reader has caught up with tshark may spend on findings: tshark's output
# waits meanwhile (the read-ahead queue holds QUEUED_CHUNKS MiB), so the reader never falls far behind.
FINDINGS_TICK_S = 0.5


@dataclass
class _Early:
    copy: WireExchange
    fingerprint: tuple[Any, ...]
    plan: SessionPlan
    action: str


def _copy(ex: WireExchange) -> WireExchange:
    """A copy ``settle`` and the decoder may change without touching ``ex`` (which later packets may
    still change, and which is settled again at the end)."""
    c = copy.copy(ex)
    c.req_chunks, c.resp_chunks = list(ex.req_chunks), list(ex.resp_chunks)
    c.req_headers, c.resp_headers, c.trailers = list(ex.req_headers), list(ex.resp_headers), list(ex.trailers)
    c.req_coding, c.resp_coding, c.problems = list(ex.req_coding), list(ex.resp_coding), list(ex.problems)
    c.meta = copy.deepcopy(ex.meta)
    c.reset = copy.deepcopy(ex.reset)
    return c


def fingerprint(ex: WireExchange) -> tuple[Any, ...]:
    """Every field of a settled exchange, bodies as digests: equal fingerprints decode alike."""
    out: list[Any] = []
    for f in fields(ex):
        v = getattr(ex, f.name)
        if f.name in ("req_chunks", "resp_chunks"):
            # each chunk's length is in the tuple, so one digest of the bodies joined tells them
            # apart (a streamed answer has thousands of chunks: one digest update each cost more)
            v = (tuple((pkt, ts, len(data)) for pkt, ts, data in v),
                 hashlib.blake2b(b"".join(data for _pkt, _ts, data in v)).digest())
        elif isinstance(v, bytes):
            v = hashlib.blake2b(v).digest()
        else:
            v = copy.deepcopy(v)
        out.append((f.name, v))
    return tuple(out)


class EarlyRuns:
    """Decodes and writes the HTTP/2 Runs of ended connections through ``imp`` as the capture is
    read (``read``), then everything else (``finish``)."""

    def __init__(self, imp: ExchangeImporter, findings: FindingsAhead | None = None) -> None:
        self.imp = imp
        self.early: dict[int, _Early] = {}  # id(original exchange) →
        self.findings = findings
        self.unanalysed: list[str] = []  # sessions written early, not yet handed to ``findings``

    def read(self, packets: Iterable[Packet], reassembler: Reassembler, progress: Progress) -> None:
        """Feed ``packets`` (in capture order) to ``reassembler``, writing Runs as connections end."""
        for pkt in packets:
            reassembler.feed(pkt)
            if reassembler.ended:
                for conn in reassembler.ended:
                    self.ended(conn)
                reassembler.ended.clear()
            if not reassembler.packets & 255:
                progress.update(reassembler.packets)

    def finish(self, readable: Sequence[WireExchange], progress: Progress) -> ExchangeImport:
        """Once the capture is read and every connection settled (``Reassembler.finish``): the
        sessions of ``readable`` not written early (or taken back) are decoded and written."""
        sessions, units = Counter(ex.session_key for ex in readable), Counter(ex.unit for ex in readable)
        rest = [ex for ex in readable if not self.written(ex, sessions[ex.session_key], units[ex.unit])]
        progress.total, progress.unit = len(rest), "exchanges decoded"
        for i, ex in enumerate(rest):
            progress.update(i + 1)
            part = self.imp.decode(ex)
            if part is not None:
                self.imp.add(part)
        out = self.imp.finish()
        # Sessions written early are listed where the whole-capture import lists them (the summary,
        # --json, the order findings are stored in): the streams by request start, then the rest.
        place = {ex.session_key: i for i, ex in enumerate(readable)
                 if ex.route is not None and ex.route.transport in STREAM_TRANSPORTS}
        out.result.written.sort(key=lambda sid: place.get(sid, len(place)))
        out.session_ids = out.result.session_ids
        return out

    def idle(self) -> None:
        """The reader has caught up with tshark: sessions written early are committed now rather
        than when a batch fills (an import stopped halfway keeps them; each commit has a cost, so
        not after every session while tshark's output is waiting). Then the findings of the sessions
        committed are computed for a while (``FINDINGS_TICK_S``): tshark keeps dissecting on the
        other core, its output waits in the read-ahead queue, and the end of the import has that
        much less to do (``analysis.ahead``)."""
        self.imp.writer.commit()
        if self.findings is not None:
            self.findings.add(self.unanalysed)
            self.unanalysed.clear()
            if self.findings.due():
                self.findings.work(FINDINGS_TICK_S)

    def take_back(self) -> None:
        """Undo every early write (the import failed: nothing of it stays)."""
        for e in reversed(list(self.early.values())):
            self.imp.writer.unwrite(e.plan, e.action)
        self.early.clear()

    def ended(self, conn: Connection) -> None:
        """``conn`` has ended: its HTTP/2 Runs are settled on copies, decoded and written when new
        (or skipped when already imported); anything else waits for ``finish``."""
        if conn.http1 is not None:
            return
        for ex in conn.exchanges:
            route = ex.route
            if ex.ignored or route is None or route.transport != "run":
                continue
            work = _copy(ex)
            settle(conn, work)
            fp = fingerprint(work)
            part = self.imp.decode(work)
            assert part is not None  # it has a route
            plan = self.imp.plan.stream(part, [])
            (action,) = self.imp.writer.write([plan], only=("new", "skip"))
            if action is None:
                self.imp.forget(work)  # decoded again at the end, in its place among the others
                continue
            self.early[id(ex)] = _Early(work, fp, plan, action)
            if action == "new":
                self.unanalysed.append(plan.info.session_id)

    def written(self, ex: WireExchange, same_session: int, same_unit: int) -> bool:
        """Whether ``ex`` (settled with the whole capture read) was written early as it is now.
        ``same_session``/``same_unit``: how many exchanges of the capture have its session key / unit.
        One written early that could differ is taken back; the caller imports it with the rest."""
        e = self.early.pop(id(ex), None)
        if e is None:
            return False
        if same_session == 1 and same_unit == 1 and fingerprint(ex) == e.fingerprint:
            return True
        self.imp.writer.unwrite(e.plan, e.action)
        self.imp.forget(e.copy)
        return False
