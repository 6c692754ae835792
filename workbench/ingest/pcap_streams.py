"""HTTP exchanges from a packet capture, with the packet and time at which each piece arrived.

Input: the packets ``workbench.ingest.tshark`` reads (TCP reassembled and TLS decrypted by
tshark). Output: one ``WireExchange`` per HTTP/2 stream or HTTP/1.1 request/response, with its
headers and its bodies as the chunks that crossed the wire — each chunk stamped with the packet
that completed it — plus how it ended (END_STREAM, RST_STREAM, GOAWAY, a closed connection, or the
end of the capture).

- **HTTP/2**: frames as tshark decoded them (HPACK included). A DATA frame that ends a body may
  come with the whole body tshark reassembled; its own bytes are the tail after what came before.
  When that body is not the sum of the frames (tshark undid a content-encoding), it replaces them.
- **HTTP/1.1**: the decrypted bytes of each direction go through ``h11`` (two parsers: one reads
  what the client sends, one what the server answers). Chunked bodies come out chunk by chunk, so a
  RunSSE frame keeps the time of its own packet.
- **TLS without keys**: a connection whose application data tshark saw but could not decrypt is
  kept as ``Connection.undecryptable``; nothing is guessed about what it carried.

Non-agent exchanges are recognised at their headers and their bodies are not kept.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import h11

from workbench.decode.classify import ENVELOPED
from workbench.ingest.exchange import Exchange
from workbench.ingest.tshark import (
    H2_CONTINUATION,
    H2_DATA,
    H2_END_STREAM,
    H2_GOAWAY,
    H2_HEADERS,
    H2_RST_STREAM,
    TCP_ACK,
    TCP_FIN,
    TCP_RST,
    TCP_SYN,
    H2Frame,
    Packet,
)
from workbench.wire.envelope import EnvelopeParser
from workbench.wire.inflate import InflateBudget, codings_of

Wire = tuple[int, int]            # (packet number, capture time in µs)
Chunk = tuple[int, int, bytes]    # (packet number, capture time in µs, bytes)

# HTTP/2 error codes (RFC 9113 §7), for messages and ``meta.reset``.
H2_ERRORS = {0: "NO_ERROR", 1: "PROTOCOL_ERROR", 2: "INTERNAL_ERROR", 3: "FLOW_CONTROL_ERROR",
             4: "SETTINGS_TIMEOUT", 5: "STREAM_CLOSED", 6: "FRAME_SIZE_ERROR", 7: "REFUSED_STREAM", 8: "CANCEL",
             9: "COMPRESSION_ERROR", 10: "CONNECT_ERROR", 11: "ENHANCE_YOUR_CALM", 12: "INADEQUATE_SECURITY",
             13: "HTTP_1_1_REQUIRED"}
CONTENT_CODINGS = ("gzip", "x-gzip", "deflate", "br", "zstd")


def _seconds(w: Wire | None) -> float | None:
    return w[1] / 1_000_000 if w is not None else None


@dataclass
class WireExchange(Exchange):
    """An Exchange whose bodies are kept as timed chunks, with how each side ended."""

    req_chunks: list[Chunk] = field(default_factory=list)
    resp_chunks: list[Chunk] = field(default_factory=list)
    req_begin: Wire | None = None
    req_end: Wire | None = None
    resp_begin: Wire | None = None
    resp_end: Wire | None = None
    reset: dict[str, Any] | None = None
    truncated: bool = False          # the capture stopped before this exchange ended
    ignored: bool = False            # not agent traffic: bodies not kept
    headers_lost: bool = False       # tshark could not decode a header block (HPACK state)
    resp_decoded: bool = False       # the response body came content-decoded from tshark
    problems: list[str] = field(default_factory=list)

    def chunks(self, direction: str) -> list[Chunk]:
        return self.req_chunks if direction == "client" else self.resp_chunks

    def body_end(self, direction: str) -> Wire:
        """Where a side's body was complete: its end, else its last chunk, else where it began."""
        chunks = self.chunks(direction)
        end = self.req_end if direction == "client" else self.resp_end
        begin = self.req_begin if direction == "client" else self.resp_begin
        for w in (end, (chunks[-1][0], chunks[-1][1]) if chunks else None, begin, self.req_begin):
            if w is not None:
                return w
        return (0, 0)


# Counting envelopes per chunk only: nothing is inflated (the decoder did that once).
_COUNT_ONLY = InflateBudget(frame=0, session=0, total=0)


def frame_wires(ex: WireExchange, direction: str, transport: str, n_frames: int) -> list[Wire]:
    """The packet that completed each of ``n_frames`` decoded frames of one side of ``ex``.

    An enveloped body's frames are the envelopes in order: each completes in the chunk that holds
    its last byte. Anything else (one unary message, an HTTP error body) completes with its body.
    """
    end = ex.body_end(direction)
    chunks = ex.chunks(direction)
    if (transport, direction) in ENVELOPED and chunks and n_frames:
        parser = EnvelopeParser(inflate=_COUNT_ONLY.session())
        wires: list[Wire] = []
        for pkt, ts, data in chunks:
            wires += [(pkt, ts)] * len(parser.feed_fast(data))
        wires += [end] * len(parser.close())
        if len(wires) == n_frames:
            return wires
    return [end] * n_frames


@dataclass
class Connection:
    """One TCP connection as tshark numbered it (``tcp.stream``)."""

    index: int
    first: Wire
    client: str | None = None
    server: str | None = None
    sni: str | None = None
    client_random: str | None = None
    encrypted_records: int = 0
    decrypted: bool = False
    lost_segment: bool = False
    last: Wire = (0, 0)
    fin: dict[str, Wire] = field(default_factory=dict)
    rst: tuple[str, Wire] | None = None
    goaway: dict[str, Any] | None = None
    h2: dict[int, WireExchange] = field(default_factory=dict)
    exchanges: list[WireExchange] = field(default_factory=list)
    http1: Http1 | None = None
    problems: list[str] = field(default_factory=list)
    ended: bool = False              # both sides sent FIN, or one RST: handed to ``Reassembler.ended``

    @property
    def key(self) -> str:
        """Names the connection across files: its TLS client random, else its endpoints and start."""
        if self.client_random:
            return self.client_random[:16]
        return hashlib.sha256(f"{self.client}|{self.server}|{self.first[1]}".encode()).hexdigest()[:16]

    @property
    def server_name(self) -> str:
        return self.sni or self.server or "?"

    @property
    def undecryptable(self) -> bool:
        return self.encrypted_records > 0 and not self.decrypted

    def side(self, pkt: Packet) -> str:
        if self.client is None:
            # No handshake seen: the lower port is taken for the server's.
            a, b = pkt.src.rsplit(":", 1)[1], pkt.dst.rsplit(":", 1)[1]
            self.client, self.server = (pkt.src, pkt.dst) if (a.isdigit() and b.isdigit() and int(a) > int(b)) \
                else (pkt.dst, pkt.src)
        return "client" if pkt.src == self.client else "server"

    def meta(self) -> dict[str, Any]:
        m: dict[str, Any] = {"tcp_stream": self.index, "client": self.client, "server": self.server}
        if self.sni:
            m["sni"] = self.sni
        return m

    # exchanges ---------------------------------------------------------------------------------

    def new_exchange(self, ident: str, sub: str, w: Wire) -> WireExchange:
        key = self.key
        ex = WireExchange(ident=ident, stream_key=f"{key}/{sub}", session_key=f"pcap-{key}-{sub}", method="",
                          host="", path="", unit=f"pcap:{key}:{sub}", req_begin=w)
        ex.meta = {"connection": self.meta(), "packets": [w[0], w[0]]}
        self.exchanges.append(ex)
        return ex


def _host(authority: str | None, fallback: str) -> str:
    if not authority:
        return fallback
    if authority.startswith("["):
        return authority[1:].split("]", 1)[0]
    return authority.rsplit(":", 1)[0] if authority.count(":") == 1 else authority


def _is_agent(ex: WireExchange) -> bool:
    return ex.route is not None


class Http2:
    """HTTP/2 frames of one connection into exchanges."""

    @staticmethod
    def frame(conn: Connection, side: str, pkt: Packet, f: H2Frame) -> None:
        w = (pkt.number, pkt.ts_us)
        if f.stream_id == 0:
            # The first side to send GOAWAY is the one that ended the connection; the other side's
            # GOAWAY (a client closing its session in reply) does not change who did. The first
            # sender may send another (a graceful shutdown lowers last_stream_id): that one counts.
            if f.type == H2_GOAWAY and (conn.goaway is None or conn.goaway["side"] == side):
                code = f.error_code or 0
                conn.goaway = {"side": side, "h2_error_code": code, "code": H2_ERRORS.get(code, str(code)),
                               "last_stream_id": f.last_stream_id, "packet": pkt.number}
            return
        ex = conn.h2.get(f.stream_id)
        if ex is None:
            ex = conn.new_exchange(f"tcp.stream {conn.index} h2 stream {f.stream_id}", str(f.stream_id), w)
            ex.http_version = "HTTP/2.0"
            conn.h2[f.stream_id] = ex
        ex.meta["packets"][1] = pkt.number
        if f.type in (H2_HEADERS, H2_CONTINUATION):
            Http2._headers(conn, ex, side, f, w)
        elif f.type == H2_DATA:
            Http2._data(ex, side, pkt, f)
        elif f.type == H2_RST_STREAM:
            code = f.error_code or 0
            name = H2_ERRORS.get(code, str(code))
            ex.reset = {"side": side, "h2_error_code": code, "code": name, "after_response_end": ex.resp_end is not None,
                        "message": f"stream reset by {side} ({name})", "packet": pkt.number}
            ex.req_end = ex.req_end or w
            if ex.resp_end is None:
                ex.error = ex.reset["message"]
                ex.resp_end = w
        if f.flags & H2_END_STREAM and f.type in (H2_HEADERS, H2_DATA):
            if side == "client":
                ex.req_end = w
            else:
                ex.resp_end = w

    @staticmethod
    def _headers(conn: Connection, ex: WireExchange, side: str, f: H2Frame, w: Wire) -> None:
        if f.headers_lost:
            ex.headers_lost = True
            return
        if f.headers is None:
            return  # a HEADERS frame whose block continues in CONTINUATION frames
        pseudo = {k: v for k, v in f.headers if k.startswith(":")}
        plain = [(k, v) for k, v in f.headers if not k.startswith(":")]
        if side == "client":
            if not ex.path:
                ex.method, ex.path = pseudo.get(":method", ""), pseudo.get(":path", "")
                ex.host = _host(pseudo.get(":authority"), conn.sni or (conn.server or "").rsplit(":", 1)[0])
                ex.req_headers = plain
                ex.ignored = not _is_agent(ex)
                ex.req_begin = w
        elif ex.status is None and ":status" in pseudo:
            ex.status = int(pseudo[":status"])
            ex.resp_headers = plain
            ex.resp_begin = w
        else:
            ex.trailers = plain

    @staticmethod
    def _data(ex: WireExchange, side: str, pkt: Packet, f: H2Frame) -> None:
        if ex.ignored:
            return
        if f.data is None:
            ex.problems.append(f"packet {pkt.number}: tshark reported no payload for a DATA frame")
            return
        data = f.data
        chunks = ex.chunks(side)
        if f.flags & H2_END_STREAM and len(data) != f.payload_len:
            # tshark put the whole reassembled body here: this frame's bytes are its tail
            before = b"".join(c[2] for c in chunks)
            if len(data) == len(before) + f.payload_len and data.startswith(before):
                data = data[len(before):]
            else:  # a body tshark decoded (content-encoding): it replaces the frames
                chunks.clear()
                if side == "server":
                    ex.resp_decoded = True
        if data:
            chunks.append((pkt.number, pkt.ts_us, data))


class Http1:
    """Both directions of one HTTP/1.1 connection through h11, one exchange per request."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.reader = h11.Connection(h11.SERVER)   # parses what the client sends
        self.answers = h11.Connection(h11.CLIENT)  # parses what the server sends
        self.open: deque[WireExchange] = deque()   # requests whose response has not ended
        self.unsent: deque[h11.Request] = deque()  # requests the answer parser has not seen yet
        self.current: WireExchange | None = None   # the request being read
        self.count = 0
        self.broken: str | None = None

    def feed(self, side: str, pkt: Packet, data: bytes) -> None:
        if self.broken:
            return
        try:
            if side == "client":
                self.reader.receive_data(data)
                self._requests(pkt)
            else:
                self.answers.receive_data(data)
                self._responses(pkt)
        except h11.ProtocolError as exc:
            self.broken = f"packet {pkt.number}: {'request' if side == 'client' else 'response'} not HTTP/1.1: {exc}"
            for ex in [*self.open, *([self.current] if self.current else [])]:
                ex.problems.append(self.broken)

    def _requests(self, pkt: Packet) -> None:
        w = (pkt.number, pkt.ts_us)
        for ev in _events(self.reader):
            if isinstance(ev, h11.Request):
                headers = _headers(ev)
                ex = self.conn.new_exchange(f"tcp.stream {self.conn.index} request {self.count + 1}",
                                            f"h1-{self.count}", w)
                self.count += 1
                ex.method, ex.path = ev.method.decode("latin-1"), ev.target.decode("latin-1")
                ex.http_version = "HTTP/" + ev.http_version.decode("latin-1")
                ex.req_headers = headers
                ex.host = _host(ex.header("host"), self.conn.sni or (self.conn.server or "").rsplit(":", 1)[0])
                ex.ignored = not _is_agent(ex)
                self.current = ex
                self.open.append(ex)
                self.unsent.append(h11.Request(method=ev.method, target=ev.target,
                                               headers=[("host", ex.host or "-"), ("content-length", "0")]))
                self._send_requests()
            elif isinstance(ev, h11.Data) and self.current is not None:
                self.current.meta["packets"][1] = pkt.number
                if not self.current.ignored:
                    self.current.req_chunks.append((pkt.number, pkt.ts_us, bytes(ev.data)))
            elif isinstance(ev, h11.EndOfMessage) and self.current is not None:
                self.current.req_end = w
                self.current = None
                # the reader answers for the server it stands in for, so it can read the next request
                self.reader.send(h11.Response(status_code=200, headers=[("content-length", "0")]))
                self.reader.send(h11.EndOfMessage())
                if self.reader.our_state is h11.DONE and self.reader.their_state is h11.DONE:
                    self.reader.start_next_cycle()

    def _send_requests(self) -> None:
        a = self.answers
        while self.unsent:
            if a.our_state is h11.DONE and a.their_state is h11.DONE:
                a.start_next_cycle()
            if a.our_state is not h11.IDLE:
                return
            a.send(self.unsent.popleft())
            a.send(h11.EndOfMessage())

    def _responses(self, pkt: Packet) -> None:
        w = (pkt.number, pkt.ts_us)
        for ev in _events(self.answers):
            ex = self.open[0] if self.open else None
            if ex is None:
                raise h11.RemoteProtocolError("a response without a request")
            ex.meta["packets"][1] = pkt.number
            if isinstance(ev, h11.Response):
                ex.status = ev.status_code
                ex.resp_headers = _headers(ev)
                ex.resp_begin = w
            elif isinstance(ev, h11.Data):
                if not ex.ignored:
                    ex.resp_chunks.append((pkt.number, pkt.ts_us, bytes(ev.data)))
            elif isinstance(ev, h11.EndOfMessage):
                ex.trailers = _headers(ev)
                ex.resp_end = w
                self.open.popleft()
                self._send_requests()

    def close(self, side: str, pkt: Packet) -> None:
        """The side's FIN: a body that runs to the connection's end ends here."""
        self.feed(side, pkt, b"")


def _events(conn: h11.Connection) -> Iterator[Any]:
    """The events ``conn`` has whole so far: up to the point where it needs more bytes."""
    while True:
        ev = conn.next_event()
        if ev is h11.NEED_DATA or ev is h11.PAUSED or isinstance(ev, h11.ConnectionClosed):
            return
        yield ev


def _headers(ev: h11.Request | h11.Response | h11.EndOfMessage) -> list[tuple[str, str]]:
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in ev.headers.raw_items()]


class Reassembler:
    """Feed packets in capture order; ``finish()`` gives every connection with its exchanges."""

    def __init__(self) -> None:
        self.connections: dict[int, Connection] = {}
        self.packets = 0
        self.bytes = 0
        self.last: Wire = (0, 0)
        # Connections that ended (both FINs, or an RST) since the reader last looked: their
        # exchanges can be imported before the capture is read to its end (``workbench.ingest.pcap_early``).
        self.ended: list[Connection] = []

    def feed(self, pkt: Packet) -> None:
        self.packets += 1
        self.bytes += pkt.size
        w = (pkt.number, pkt.ts_us)
        self.last = w
        conn = self.connections.get(pkt.stream)
        if conn is None:
            conn = self.connections[pkt.stream] = Connection(pkt.stream, w)
        conn.last = w
        flags = pkt.tcp_flags
        if flags & TCP_SYN:
            conn.client, conn.server = (pkt.src, pkt.dst) if not flags & TCP_ACK else (pkt.dst, pkt.src)
        if pkt.client_hello:
            conn.client, conn.server = pkt.src, pkt.dst
            conn.sni = pkt.sni or conn.sni
            conn.client_random = pkt.client_random or conn.client_random
        side = conn.side(pkt)
        conn.lost_segment |= pkt.lost_segment
        conn.encrypted_records += pkt.encrypted_records
        if pkt.problem:
            conn.problems.append(f"packet {pkt.number}: {pkt.problem}")
        if pkt.h2:
            conn.decrypted = True
            for f in pkt.h2:
                Http2.frame(conn, side, pkt, f)
        if pkt.plain:
            conn.decrypted = True
            if conn.http1 is None:
                conn.http1 = Http1(conn)
            for data in pkt.plain:
                conn.http1.feed(side, pkt, data)
        if flags & TCP_FIN:
            conn.fin.setdefault(side, w)
            if conn.http1 is not None:
                conn.http1.close(side, pkt)
        if flags & TCP_RST and conn.rst is None:
            conn.rst = (side, w)
        if not conn.ended and (conn.rst is not None or len(conn.fin) == 2):
            conn.ended = True
            self.ended.append(conn)

    def finish(self, cut_short: bool = False) -> list[Connection]:
        for conn in self.connections.values():
            for ex in conn.exchanges:
                settle(conn, ex)
        return list(self.connections.values())


def settle(conn: Connection, ex: WireExchange) -> None:
    """How an exchange ended, once the capture is over (or its connection, see ``pcap_early``);
    bodies joined for the decoder."""
    closed = conn.rst or next(((s, w) for s, w in conn.fin.items()), None)
    if ex.resp_end is None and ex.error is None:
        goaway = conn.goaway
        if (goaway is not None and goaway.get("last_stream_id") is not None and ex.http_version == "HTTP/2.0"
                and int(ex.stream_key.rsplit("/", 1)[1]) > goaway["last_stream_id"]):
            ex.error = f"refused by GOAWAY ({goaway['code']}) from the {goaway['side']}"
        elif closed is not None:
            how = "reset" if conn.rst else "closed"
            ex.error = f"connection {how} by the {closed[0]} before the response ended"
        else:
            ex.truncated = True
    if conn.goaway is not None:
        ex.meta["goaway"] = conn.goaway
    if ex.reset is not None:
        ex.meta["reset"] = {k: v for k, v in ex.reset.items() if k != "packet"}
    if conn.lost_segment:
        ex.meta["capture_lost_segments"] = True
    problems = conn.problems + ex.problems
    if problems:
        ex.meta["capture_problems"] = problems[:5]
    if ex.headers_lost and not ex.path:
        ex.ignored = True
    ex.t_req_start, ex.t_req_end = _seconds(ex.req_begin), _seconds(ex.req_end)
    ex.t_resp_start, ex.t_resp_end = _seconds(ex.resp_begin), _seconds(ex.resp_end)
    if ex.ignored:
        ex.req_body, ex.resp_body = b"", (b"" if ex.status is not None else None)
        return
    ex.req_body = b"".join(c[2] for c in ex.req_chunks)
    ex.resp_body = b"".join(c[2] for c in ex.resp_chunks) if ex.status is not None or ex.resp_chunks else None
    for direction in ("client", "server"):
        _undo_content_coding(ex, direction)


def _undo_content_coding(ex: WireExchange, direction: str) -> None:
    """HTTP content-coding is undone as for flow files, within the inflate budgets, by
    ``decode_exchange`` (Connect's own per-envelope gzip stays for the decoder). The decoded body
    replaces the frames as a whole: complete at the body's end."""
    response = direction == "server"
    codings = codings_of(ex.header("content-encoding", response=response))
    body = ex.resp_body if response else ex.req_body
    if not body or not codings or any(c not in CONTENT_CODINGS for c in codings) or (response and ex.resp_decoded):
        return
    end = ex.body_end(direction)
    ex.chunks(direction)[:] = [(end[0], end[1], body)]
    if response:
        ex.resp_coding = codings
    else:
        ex.req_coding = codings


def agent_exchanges(connections: Iterable[Connection]) -> list[WireExchange]:
    """Every decrypted exchange in the order its request began (non-agent ones too, for counting)."""
    out = [ex for c in connections for ex in c.exchanges if ex.path or ex.headers_lost]
    out.sort(key=lambda ex: ex.req_begin or (0, 0))
    return out
