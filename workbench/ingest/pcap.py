"""Packet captures decrypted with a TLS key log: ``workbench import FILE.pcapng --keylog KEYS``.

A capture of the real connection, with the session keys the client logged (``SSLKEYLOGFILE``,
Node's ``--tls-keylog``), shows agent traffic with nothing in between: no proxy, no certificate
to trust, and every frame at the time its packet crossed the interface. tshark does the TCP
reassembly, TLS decryption and HTTP/2 (``workbench.ingest.tshark``); ``pcap_streams`` turns its
packets into HTTP exchanges with timed body chunks. From there the import is the one every
recorded exchange takes (``workbench.ingest.exchange``): the same decoding and redaction, RunSSE
and BidiAppend joined by request id and ordered by append_seqno, the same session status, written
whole per session with a ``source_key`` per frame (unit ``pcap:<connection>:<stream>``, the
connection named by its TLS client random), so importing a capture again adds nothing.

What differs from flow files and HAR is order and time. Nothing is rebuilt from the protocol: a
session's frames are in capture order, both directions as they interleaved on the wire, each with
the time of the packet that completed it (``sessions.meta``: ``"order": "time"``, ``"timing":
"wire"``; ``frames.meta.packet`` is that packet's number in the capture, as Wireshark shows it).

A connection tshark could not decrypt (no key for it in the key log) is reported with its server
name; nothing is recorded for it. A capture that stops mid-stream keeps the frames that were
complete; the session is ``incomplete``.
"""

from __future__ import annotations

import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.analysis.context import ORDER_TIME
from workbench.decode.classify import Decoder
from workbench.ingest import ImportContext, ImportResult, IngestError
from workbench.ingest.exchange import Part
from workbench.ingest.exchange_import import ExchangeImporter
from workbench.ingest.identity import PlannedFrame, SessionPlan, frame_key
from workbench.ingest.pcap_early import EarlyRuns
from workbench.ingest.pcap_streams import Connection, Reassembler, WireExchange, agent_exchanges, frame_wires
from workbench.ingest.progress import Progress
from workbench.ingest.runs import PlanBuilder
from workbench.ingest.tshark import TsharkRun, find_tshark, read_packets
from workbench.protocol.append_meta import REORDER_AFTER_END_S, REORDER_WINDOW_S, append_answer
from workbench.store.db import Store

PCAP_MAGICS = (b"\xd4\xc3\xb2\xa1", b"\xa1\xb2\xc3\xd4", b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")
PCAPNG_MAGIC = b"\x0a\x0d\x0d\x0a"
SOURCE = "import:pcap"
# what every unit and session id of a capture starts with (``pcap_streams.Connection.new_exchange``)
UNIT_PREFIX, SESSION_PREFIX = "pcap:", "pcap-"
TIMING_WIRE = ("frames are in capture order, both directions as they crossed the wire; ts is the capture time "
               "of the packet that completed each frame")


def detect(path: Path, head: bytes) -> bool:
    return header_problem(head) is None


def header_problem(head: bytes) -> str | None:
    """Why ``head`` does not start a pcap or pcapng file (None when it does)."""
    if head[:4] in PCAP_MAGICS:
        little = head[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1")
        return None if len(head) >= 24 and head[4:6] == (b"\x02\x00" if little else b"\x00\x02") \
            else "a pcap magic number without a pcap file header"
    if head[:4] == PCAPNG_MAGIC:
        return None if len(head) >= 28 and head[8:12] in (b"\x4d\x3c\x2b\x1a", b"\x1a\x2b\x3c\x4d") \
            else "a pcapng block type without a pcapng section header"
    return "neither a pcap nor a pcapng file"


class WirePlanBuilder(PlanBuilder):
    """Sessions as ``PlanBuilder`` makes them, put back in wire order with wire times."""

    def stream(self, part: Part, appends: list[Part]) -> SessionPlan:
        for a in appends:
            append_answer_as_live(a)
        return self._wire(super().stream(part, appends), [part, *appends])

    def orphan_appends(self, request_id: str, appends: list[Part]) -> SessionPlan:
        for a in appends:
            append_answer_as_live(a)
        return self._wire(super().orphan_appends(request_id, appends), appends)

    def single(self, part: Part) -> SessionPlan:
        return self._wire(super().single(part), [part])

    @staticmethod
    def _wire(plan: SessionPlan, parts: list[Part]) -> SessionPlan:
        where: dict[int, tuple[tuple[int, int], str]] = {}  # frame → (packet, time), unit
        for p in parts:
            assert isinstance(p.ex, WireExchange)
            for direction, frames in (("client", p.client), ("server", p.server)):
                wires = frame_wires(p.ex, direction, p.route.transport, len(frames))
                for k, (f, w) in enumerate(zip(frames, wires, strict=True)):
                    where[id(f)] = (w, frame_unit(p.ex.unit, direction, k))

        def key(i: int) -> tuple[tuple[int, int], int]:
            pf = plan.frames[i]
            w = where[id(pf.frame)][0] if id(pf.frame) in where else (0, pf.ts_us)
            return w, int((pf.frame.meta or {}).get("body_index", i))

        ordered = []
        for i in sorted(range(len(plan.frames)), key=key):
            pf = plan.frames[i]
            (packet, ts), unit = where[id(pf.frame)]
            pf.ts_us = ts
            pf.source_key = frame_key(unit, 0)
            pf.frame.meta = {**(pf.frame.meta or {}), "packet": packet}
            ordered.append(pf)
        seqno_of = {id(f): p.seqno for p in parts if p.route.transport == "bidi_append" and p.seqno is not None
                    for f in (*p.client, *p.server)}
        end = parts[0].ex.t_resp_end if parts[0].route.transport != "bidi_append" else None
        plan.frames = in_append_order(ordered, seqno_of, int(end * 1_000_000) if end else None)
        plan.units = [where[id(pf.frame)][1] for pf in plan.frames]
        info = plan.info
        info.meta.pop("order_note", None)
        info.meta.update(order=ORDER_TIME, timing="wire", timing_note=TIMING_WIRE)
        ex = parts[0].ex
        if isinstance(ex, WireExchange) and ex.truncated and info.status == "incomplete":
            info.error = "the capture ended before this exchange did; the frames that were complete are recorded"
        return plan


def append_answer_as_live(part: Part) -> None:
    """A BidiAppend's answer as live capture records it (``workbench.protocol.append_meta.append_answer``):
    the status of a gRPC-Web trailer frame joins the append's facts (``grpc_status`` in its meta), and
    only a refusal, or anything other than the empty BidiAppendResponse, stays a frame. (Flow and
    HAR imports keep those frames; docs/import.md.)"""
    part.server, trailer = append_answer(part.server)
    part.ex.trailers = [*part.ex.trailers, *trailer.items()]


def in_append_order(frames: list[PlannedFrame], seqno_of: dict[int, int],
                    stream_end_us: int | None) -> list[PlannedFrame]:
    """BidiAppends in ``append_seqno`` order, as the server applies them and live capture records them.

    Appends travel on parallel connections, so one can overtake another on the wire. An append
    that arrives ahead of the next expected seqno is held (with the answer to it) until the gap
    fills, at most as long as live capture waits (``workbench.capture.appends``); then it follows
    the frame that released it, at that frame's time, with its own arrival kept in
    ``frames.meta.arrived_us`` (``packet`` stays the packet that completed it). Times never go back.

    Only a held append gets ``arrived_us``. A frame emitted in capture order can still carry a
    packet time a few microseconds before the previous packet's: on loopback the kernel stamps a
    packet before it queues it for tcpdump, so two packets sent at once from two CPUs (the client
    and the server, or two connections) can be queued in the other order. That frame did not wait
    for anything; its time is raised to the previous one and nothing else is claimed about it.
    """
    out: list[PlannedFrame] = []
    held: dict[int, list[PlannedFrame]] = {}
    oldest = 0
    expected = 0

    def emit(pf: PlannedFrame, *, was_held: bool = False) -> None:
        if out and pf.ts_us < out[-1].ts_us:
            if was_held:
                pf.frame.meta = {**(pf.frame.meta or {}), "arrived_us": pf.ts_us}
            pf.ts_us = out[-1].ts_us
        out.append(pf)

    def give_up() -> None:
        nonlocal expected
        for n in sorted(held):
            for pf in held.pop(n):
                emit(pf, was_held=True)
            expected = max(expected, n + 1)

    for pf in frames:
        if held and (pf.ts_us - oldest >= REORDER_WINDOW_S * 1_000_000
                     or (stream_end_us is not None and pf.ts_us - stream_end_us >= REORDER_AFTER_END_S * 1_000_000)):
            give_up()
        n = seqno_of.get(id(pf.frame))
        if n is None:
            emit(pf)
            continue
        if n in held or n > expected:
            if not held:
                oldest = pf.ts_us
            held.setdefault(n, []).append(pf)
            continue
        emit(pf)
        if n == expected:
            expected += 1
            while expected in held:
                for h in held.pop(expected):
                    emit(h, was_held=True)
                expected += 1
    give_up()
    return out


def frame_unit(exchange_unit: str, direction: str, k: int) -> str:
    """Each frame is a unit of its own (``pcap:<connection>:<stream>/c3``, ``…/s17``): a capture of
    the same connection that holds more of it (the rest of a capture cut short) completes the session."""
    return f"{exchange_unit}/{direction[0]}{k}"


def _tshark_version(exe: str) -> str:
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "tshark"
    first = out.splitlines()[0] if out else "tshark"
    return first.split(" (")[0].replace("TShark (Wireshark)", "tshark").strip()


def _keylog(ctx: ImportContext) -> Path | None:
    raw = ctx.options.get("keylog")
    if not raw:
        return None
    keylog = Path(str(raw)).expanduser()
    try:
        with keylog.open("rb"):
            pass
    except OSError as exc:
        raise IngestError(f"--keylog {keylog}: cannot read the key log: {exc.strerror or exc}") from exc
    return keylog


def _undecryptable_note(conns: list[Connection], path: Path, keylog: Path | None) -> str:
    names = Counter(c.server_name for c in conns)
    listed = ", ".join(f"{name} ({n})" if n > 1 else name for name, n in names.most_common(8))
    where = f"in {keylog}" if keylog else "(no --keylog given, and none embedded in the capture)"
    n = len(conns)
    return (f"{path}: {n} TLS connection{'s' if n != 1 else ''} could not be decrypted — no key for "
            f"{'them' if n != 1 else 'it'} {where}: {listed}{'…' if len(names) > 8 else ''}; "
            f"nothing was recorded for {'them' if n != 1 else 'it'}")


def capture_importer(store: Store, dec: Decoder, file_meta: dict[str, Any], warn: Callable[[str], None],
                     progress: Progress) -> ExchangeImporter:
    """The exchange pipeline as a packet capture uses it: wire order and times, pcap identities."""
    return ExchangeImporter(store, dec, source=SOURCE, file_meta=file_meta, warn=warn, progress=progress,
                            builder=WirePlanBuilder, prefixes=(UNIT_PREFIX, SESSION_PREFIX))


def run_import(ctx: ImportContext) -> ImportResult:
    path = ctx.path
    with path.open("rb") as fh:
        head = fh.read(28)
    problem = header_problem(head)
    if problem:
        raise IngestError(f"{path}: not a packet capture ({problem}); nothing imported")
    keylog = _keylog(ctx)
    exe = find_tshark(ctx.options.get("tshark"))
    fmt = "pcapng" if head[:4] == PCAPNG_MAGIC else "pcap"
    file_meta: dict[str, Any] = {"file": str(path), "file_sha256": ctx.file_sha256, "format": fmt,
                                 "dissector": _tshark_version(exe), "keylog": keylog is not None}
    imp = capture_importer(ctx.store, ctx.decoder, file_meta, ctx.warn, ctx.progress)
    early = EarlyRuns(imp, ctx.findings)  # Runs of ended connections are written while tshark reads on
    run = TsharkRun()
    reassembler = Reassembler()
    ctx.progress.total, ctx.progress.unit = None, "packets read by tshark"
    try:
        packets = read_packets(path, keylog, run, tshark=exe, tls_ports=tuple(ctx.options.get("tls_ports", ())),
                               on_idle=early.idle)
        early.read(packets, reassembler, ctx.progress)
        if run.returncode and not run.cut_short:
            raise IngestError(f"{path}: tshark could not read it (exit {run.returncode}): "
                              f"{run.complaint() or 'no message'}; nothing imported")
    except IngestError:
        early.take_back()  # "nothing imported" holds for the sessions written early too
        raise
    finally:
        ctx.progress.finish()
    if run.cut_short:
        ctx.warn(f"{path}: the capture file was cut short in the middle of a packet; what came before is imported")
    conns = reassembler.finish(run.cut_short)
    exchanges = agent_exchanges(conns)
    unreadable = [ex for ex in exchanges if ex.headers_lost and not ex.path]
    readable = [ex for ex in exchanges if ex.path]
    res = early.finish(readable, ctx.progress)
    result = ImportResult(str(path), "pcap", sessions=len(res.session_ids), frames=res.frames,
                          session_ids=res.session_ids)
    undecryptable = [c for c in conns if c.undecryptable]
    result.undecryptable = len(undecryptable)
    if undecryptable:
        n = len(undecryptable)
        result.notes.append(f"{n} TLS connection{'s' if n != 1 else ''} undecryptable")
        ctx.warn(_undecryptable_note(undecryptable, path, keylog))
    if unreadable:
        result.notes.append(f"{len(unreadable)} HTTP/2 stream{'s' if len(unreadable) != 1 else ''} with unreadable "
                            f"headers (connection captured after it began)")
    truncated = sum(1 for ex in readable if ex.truncated and ex.route is not None)
    if truncated:
        result.notes.append(f"{truncated} exchange{'s' if truncated != 1 else ''} cut off by the end of the capture")
    # a payload the dissector's fields could not place is named in the exchange's meta; say so here too
    troubled = sum(1 for ex in readable if ex.route is not None and ex.meta.get("capture_problems"))
    if troubled:
        result.notes.append(f"{troubled} exchange{'s' if troubled != 1 else ''} with dissector problems, bodies may be "
                            f"incomplete (meta.capture_problems)")
    if not conns:
        result.notes.append("no TCP traffic in the capture")
    result.notes.extend(res.notes(0, "HTTP exchange", "HTTP exchanges"))
    result.skipped_sessions = len(res.result.skipped)
    result.skipped_frames = res.result.skipped_frames
    return result
