"""tshark as the dissector of packet captures: TCP reassembly, TLS decryption, HTTP/2.

``workbench import FILE.pcapng --keylog KEYS`` reads packets through one ``tshark`` pass and
never parses TCP or TLS itself. tshark is asked for a fixed set of fields per packet (``-T fields
-e …``: one line per packet, read as it arrives, so memory stays bounded by what the importer
keeps) and this module turns each line into a ``Packet``:

- the TCP connection (``tcp.stream``), endpoints, flags, and whether tshark saw a lost segment;
- TLS facts: a ClientHello's server name (SNI) and random (which names the connection, and is
  what the key log is keyed by), and how many records were encrypted application data;
- the HTTP/2 frames tshark decoded (type, stream id, flags, length, payload, HPACK-decoded header
  fields, RST_STREAM and GOAWAY codes);
- decrypted application data no dissector took: HTTP/1.1, because the HTTP dissector is disabled.
  tshark 4.0 holds a chunked HTTP/1.1 body back until its last chunk arrived, which would put
  every frame of a RunSSE stream at the stream's end; the plaintext of each TLS record keeps the
  time of the packet that completed it, and ``h11`` frames the messages (``pcap_streams``).

Fields come flattened per packet (tshark's ``-e`` lists), so HTTP/2 frames are regrouped by
position: ``http2.type``, ``streamid``, ``flags`` and ``length`` appear once per frame, payloads
once per DATA frame, header counts once per header block. When tshark completes a body at its last
DATA frame it reports the *whole* reassembled body as that frame's data; ``H2Frame.data`` is then
cut back to the frame's own bytes by the reader of the stream (``pcap_streams``), which knows what
came before.

Why ``-T fields`` and not ``-T ek`` (JSON, exact for every string): on a 101 MB capture tshark spends
about 15 % more CPU formatting EK's JSON (22.7 s against 19.5 s) and writes twice the bytes, which
the importer then parses (4.9 s against 3.5 s of CPU). Fields mode escapes a tab, newline or
carriage return inside a value as ``\t``, ``\n``, ``\r`` (so they are safe as the separator, the
line end and the aggregator of repeated fields) but leaves a backslash as it is: a header value
``C:\new`` and one with a real newline print alike. The byte length tshark reports beside each
header name, value and server name (``*.length``) tells them apart (``_unescaped``); both layouts
give the same layers on every packet of that capture.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from workbench.ingest import IngestError
from workbench.ingest.exchange import MAX_EPOCH_US

PACKAGE = "tshark"
INSTALL_HINT = f"install the {PACKAGE} package (Debian/Ubuntu: sudo apt-get install {PACKAGE})"

# HTTP/2 frame types (RFC 9113 §6) and flags this importer reads.
H2_DATA, H2_HEADERS, H2_RST_STREAM, H2_PUSH_PROMISE, H2_GOAWAY, H2_CONTINUATION = 0, 1, 3, 5, 7, 9
H2_END_STREAM, H2_END_HEADERS, H2_PADDED = 0x1, 0x4, 0x8
TCP_FIN, TCP_SYN, TCP_RST, TCP_ACK = 0x01, 0x02, 0x04, 0x10
TLS_APPLICATION_DATA = "23"
MISSING = "<MISSING>"
AGGREGATOR = "\r"

FIELDS = (
    "frame.number", "frame.time_epoch", "frame.len",
    "tcp.stream", "ip.src", "ip.dst", "ipv6.src", "ipv6.dst", "tcp.srcport", "tcp.dstport", "tcp.flags",
    "tcp.analysis.lost_segment",
    "tls.handshake.type", "tls.handshake.random", "tls.handshake.extensions_server_name",
    "tls.record.content_type", "tls.record.opaque_type",
    "http2.type", "http2.streamid", "http2.flags", "http2.length", "http2.pad_length", "http2.data.data",
    "http2.header.count", "http2.header.name", "http2.header.value",
    "http2.header.name.length", "http2.header.value.length", "tls.handshake.extensions_server_name_len",
    "http2.rst_stream.error", "http2.goaway.error", "http2.goaway.last_stream_id",
    "data.data",
)
# Packets that carry nothing this importer reads (bare ACKs) are left out of tshark's output.
DISPLAY_FILTER = "tcp.flags.syn == 1 || tcp.flags.fin == 1 || tcp.flags.reset == 1 || tls || tcp.analysis.lost_segment"
# Preferences that decide what comes out, set explicitly so a user's Wireshark profile cannot change them.
PREFERENCES = (
    "tcp.desegment_tcp_streams:TRUE", "tcp.reassemble_out_of_order:TRUE", "tcp.analyze_sequence_numbers:TRUE",
    "tls.desegment_ssl_records:TRUE", "tls.desegment_ssl_application_data:TRUE",
)


class TsharkMissing(IngestError):
    """No tshark on this machine; the message names the package."""


@dataclass(slots=True)
class H2Frame:
    type: int
    stream_id: int
    flags: int
    length: int
    pad: int = 0
    data: bytes | None = None                  # DATA: the payload tshark reported (see the module doc)
    headers: list[tuple[str, str]] | None = None
    headers_lost: bool = False                 # a header block tshark could not decode
    error_code: int | None = None              # RST_STREAM, GOAWAY
    last_stream_id: int | None = None          # GOAWAY

    @property
    def payload_len(self) -> int:
        """Bytes of data in a DATA frame (its length without padding)."""
        return max(0, self.length - (self.pad + 1 if self.flags & H2_PADDED else 0))


@dataclass(slots=True)
class Packet:
    number: int
    ts_us: int
    size: int
    stream: int
    src: str
    dst: str
    tcp_flags: int
    lost_segment: bool = False
    client_hello: bool = False
    server_hello: bool = False
    client_random: str | None = None
    sni: str | None = None
    encrypted_records: int = 0
    h2: list[H2Frame] = field(default_factory=list)
    plain: list[bytes] = field(default_factory=list)
    problem: str | None = None                 # tshark's fields could not be regrouped for this packet


def find_tshark(explicit: str | None = None) -> str:
    found = shutil.which(explicit or "tshark")
    if not found:
        raise TsharkMissing(f"tshark not found: {INSTALL_HINT}")
    return found


def command(tshark: str, path: Path, keylog: Path | None, tls_ports: tuple[int, ...] = ()) -> list[str]:
    """The one tshark invocation: a line of fields per packet, HTTP/1.1 left as decrypted data."""
    cmd = [tshark, "-r", str(path), "-n", "-o", f"tls.keylog_file:{keylog or ''}"]
    for pref in PREFERENCES:
        cmd += ["-o", pref]
    for port in tls_ports:  # tshark finds TLS on any port by its heuristic; named ports need no guess
        cmd += ["-d", f"tcp.port=={port},tls"]
    # Fields joined by a tab, repeated ones by a carriage return, a packet per line: none of the
    # three can occur raw inside a value, which tshark escapes (see the module doc).
    cmd += ["--disable-protocol", "http", "-Y", DISPLAY_FILTER, "-T", "fields", "-E", "separator=/t",
            "-E", f"aggregator={AGGREGATOR}", "-E", "occurrence=a", "-E", "quote=n",
            "-E", "header=n"]
    for f in FIELDS:
        cmd += ["-e", f]
    return cmd


def _ts_us(epoch: str) -> int:
    """A packet's time in µs; 0 (unknown) when it is before 1970 or past year 9999 (a pcapng's
    64-bit timestamps can say anything, and no datetime holds such a time)."""
    sec, _, frac = epoch.partition(".")
    us = int(sec) * 1_000_000 + int((frac + "000000")[:6])
    return us if 0 < us <= MAX_EPOCH_US else 0


def _endpoint(layers: dict[str, list[str]], side: str) -> str:
    ip = layers.get(f"ip_{side}") or layers.get(f"ipv6_{side}") or ["?"]
    port = layers.get(f"tcp_{side}port") or ["?"]
    host = ip[-1]  # the innermost IP header (tunnels put the outer one first)
    return f"[{host}]:{port[0]}" if ":" in host else f"{host}:{port[0]}"


def _h2_frames(layers: dict[str, list[str]]) -> tuple[list[H2Frame], str | None]:
    types = layers.get("http2_type") or []
    if not types:
        return [], None
    sids = layers.get("http2_streamid") or []
    flags = layers.get("http2_flags") or []
    lengths = layers.get("http2_length") or []
    if not (len(sids) == len(flags) == len(lengths) == len(types)):
        return [], "HTTP/2 frame fields do not line up"
    frames = [H2Frame(int(t), int(s), int(f, 16), int(n)) for t, s, f, n in zip(types, sids, flags, lengths, strict=True)]
    problem = None
    # Each optional field is looked at only when present: absent, it can give no frame anything
    # (most packets carry DATA frames and nothing else, and this runs once per packet).
    pads = layers.get("http2_pad_length")
    if pads:
        padded = [f for f in frames if f.type in (H2_DATA, H2_HEADERS, H2_PUSH_PROMISE)]
        if len(pads) != len(padded):
            padded = [f for f in frames if f.type in (H2_DATA, H2_HEADERS)]
        if len(pads) == len(padded):
            for f, p in zip(padded, pads, strict=True):
                f.pad = int(p)
    if not _h2_data(frames, layers.get("http2_data_data") or []):
        problem = "HTTP/2 DATA payloads do not line up with their frames"
    _h2_headers(frames, layers)
    for name, kind in (("http2_rst_stream_error", H2_RST_STREAM), ("http2_goaway_error", H2_GOAWAY)):
        codes = layers.get(name)
        if codes:
            owners = [f for f in frames if f.type == kind]
            if len(codes) == len(owners):
                for f, c in zip(owners, codes, strict=True):
                    f.error_code = int(c, 0)
    last = layers.get("http2_goaway_last_stream_id")
    if last:
        goaways = [f for f in frames if f.type == H2_GOAWAY]
        if len(last) == len(goaways):
            for f, v in zip(goaways, last, strict=True):
                f.last_stream_id = int(v)
    return frames, problem


def _hex(value: str) -> bytes:
    # tshark writes an empty byte field (a DATA frame of length 0) as "<MISSING>"
    return b"" if value == MISSING else bytes.fromhex(value)


def _h2_data(frames: list[H2Frame], data: list[str]) -> bool:
    """Give each DATA frame its ``http2.data.data`` entry; False when they cannot be told apart.

    A body that ends with a trailers HEADERS frame (END_STREAM on HEADERS, as every gRPC answer
    does) is reported twice: each DATA frame with its own bytes, then the whole reassembled body
    once more at that HEADERS frame. Entries follow frame order, so such a copy is recognised by
    its position and dropped (the DATA frames already hold those bytes). Only a closing HEADERS
    frame before a DATA frame of the same packet can shift the DATA frames' entries; one that has
    no copy (a stream without body) is told from one that has by counting what is left.
    """
    data_frames = [f for f in frames if f.type == H2_DATA]
    extra = len(data) - len(data_frames)
    if extra < 0:
        return False
    if extra == 0:
        for f, d in zip(data_frames, data, strict=True):
            f.data = _hex(d)
        return True
    closers_left = sum(1 for f in frames if f.type == H2_HEADERS and f.flags & H2_END_STREAM)
    data_left, pos = len(data_frames), 0
    for f in frames:
        if data_left == 0:
            break  # copies after the last DATA frame shift nothing
        if f.type == H2_DATA:
            f.data, pos, data_left = _hex(data[pos]), pos + 1, data_left - 1
        elif f.type == H2_HEADERS and f.flags & H2_END_STREAM:
            copies_left = len(data) - pos - data_left
            if 0 < copies_left < closers_left:
                for df in data_frames:  # which closing HEADERS frames carry a copy is unknown
                    df.data = None
                return False
            if copies_left:
                pos += 1
            closers_left -= 1
    return True


def _h2_headers(frames: list[H2Frame], layers: dict[str, list[str]]) -> None:
    counts = [int(c) for c in layers.get("http2_header_count") or []]
    names = layers.get("http2_header_name") or []
    values = layers.get("http2_header_value") or []
    blocks = [f for f in frames if f.type in (H2_HEADERS, H2_PUSH_PROMISE, H2_CONTINUATION)]
    if not (blocks or counts or names or values):
        return  # no header block and no header field: nothing to give or to mark lost
    if len(counts) != len(blocks):
        blocks = [f for f in blocks if f.flags & H2_END_HEADERS]
    if len(counts) != len(blocks) or sum(counts) != len(names) or len(names) != len(values):
        for f in blocks:  # HPACK state missing (a connection captured from its middle) or fields unclear
            f.headers_lost = True
        return
    pos = 0
    for f, n in zip(blocks, counts, strict=True):
        f.headers = list(zip(names[pos:pos + n], values[pos:pos + n], strict=True))
        pos += n


def parse_packet(layers: dict[str, list[str]]) -> Packet | None:
    """One packet's fields (``layers_of``) as a Packet (None for a packet without TCP)."""
    stream = layers.get("tcp_stream")
    if not stream:
        return None
    pkt = Packet(int(layers["frame_number"][0]), _ts_us(layers["frame_time_epoch"][0]),
                 int((layers.get("frame_len") or ["0"])[0]), int(stream[0]),
                 _endpoint(layers, "src"), _endpoint(layers, "dst"), int((layers.get("tcp_flags") or ["0"])[0], 16),
                 lost_segment="tcp_analysis_lost_segment" in layers)
    hs = layers.get("tls_handshake_type") or []
    if "1" in hs:
        pkt.client_hello = True
        randoms = layers.get("tls_handshake_random") or []
        pkt.client_random = randoms[0] if randoms else None
        sni = layers.get("tls_handshake_extensions_server_name") or []
        pkt.sni = sni[0] if sni else None
    pkt.server_hello = "2" in hs
    # encrypted records: TLS 1.3 ones have an opaque type, TLS 1.2 application data says 23 outright
    pkt.encrypted_records = len(layers.get("tls_record_opaque_type") or []) or \
        (layers.get("tls_record_content_type") or []).count(TLS_APPLICATION_DATA)
    pkt.h2, pkt.problem = _h2_frames(layers)
    pkt.plain = [_hex(d) for d in layers.get("data_data") or []]
    return pkt


# The keys ``parse_packet`` reads: the fields' names with dots as underscores (EK's names).
_KEYS = tuple(f.replace(".", "_") for f in FIELDS)
# String fields, each with the field tshark gives its length in bytes by (see the module doc)
_STRINGS = (("http2_header_name", "http2_header_name_length"),
            ("http2_header_value", "http2_header_value_length"),
            ("tls_handshake_extensions_server_name", "tls_handshake_extensions_server_name_len"))
_ESCAPED = re.compile(r"\\([tnr\\])")
_CONTROL = {"t": "\t", "n": "\n", "r": "\r", "\\": "\\"}


def layers_of(line: bytes) -> dict[str, list[str]] | None:
    """One line of tshark's fields output as field → values (the fields it has); None when the line
    does not hold one column per field."""
    cols = line.decode("utf-8", "replace").split("\t")
    if len(cols) != len(_KEYS):
        return None
    layers = {k: v.split(AGGREGATOR) for k, v in zip(_KEYS, cols, strict=True) if v}
    for name, length in _STRINGS:
        values = layers.get(name)
        if values is None:
            if layers.get(length) == ["0"]:  # the one value, empty: a column as empty as an absent field
                layers[name] = [""]
            continue
        if any("\\" in v for v in values):
            lengths = layers.get(length) or []
            if len(lengths) != len(values):
                lengths = [""] * len(values)
            layers[name] = [_unescaped(v, n) for v, n in zip(values, lengths, strict=True)]
    return layers


def _unescaped(value: str, length: str) -> str:
    """A string field as tshark printed it, its escapes undone where its length in bytes says they
    are escapes (tshark prints each byte of a header as one character: non-ASCII ones as U+FFFD)."""
    if "\\" not in value or (length.isdigit() and int(length) == len(value)):
        return value  # backslashes of its own: nothing was escaped
    return _ESCAPED.sub(lambda m: _CONTROL[m.group(1)], value)


@dataclass
class TsharkRun:
    """What tshark said besides its packets (stderr, exit status)."""

    messages: list[str] = field(default_factory=list)
    returncode: int | None = None

    @property
    def cut_short(self) -> bool:
        return any("cut short" in m for m in self.messages)

    def complaint(self) -> str:
        """tshark's own error lines, without its notice about running as root."""
        lines = [m for m in self.messages if m and "could be dangerous" not in m]
        return "; ".join(m.removeprefix("tshark: ") for m in lines[:3])


def _drain(stream: IO[bytes], out: TsharkRun) -> None:
    for raw in stream:
        if len(out.messages) < 50:
            out.messages.append(raw.decode("utf-8", "replace").strip())


# tshark's output is read on a thread of its own, in large chunks, so that tshark never waits on a
# full pipe while the importer decodes and writes the sessions already complete (on another core
# tshark keeps dissecting). The pipe is widened where Linux allows (``F_SETPIPE_SZ``) so that a
# chunk is large and the thread needs the GIL seldom; the queue bounds what waits in memory.
PIPE_SIZE = 1 << 20
READ_CHUNK = 1 << 20
QUEUED_CHUNKS = 64


def _widen_pipe(fd: int) -> None:
    try:
        import fcntl  # Unix only: imported where used, so that the module loads elsewhere

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_SIZE)
    except (ImportError, OSError):
        pass  # not Linux, or above /proc/sys/fs/pipe-max-size: the default pipe does, only slower


def _pump(fd: int, chunks: queue.Queue[bytes | BaseException | None], stop: threading.Event) -> None:
    try:
        while not stop.is_set():
            data = os.read(fd, READ_CHUNK)
            if not data:
                break
            chunks.put(data)
    except BaseException as exc:  # handed to the reader, which raises it
        chunks.put(exc)
    finally:
        chunks.put(None)


def _lines(fd: int, on_idle: Callable[[], object] | None = None) -> Generator[bytes, None, None]:
    """The lines tshark writes to ``fd``, read ahead by a thread; ``on_idle`` is called when none
    are waiting (before waiting for more)."""
    chunks: queue.Queue[bytes | BaseException | None] = queue.Queue(QUEUED_CHUNKS)
    stop = threading.Event()
    pump = threading.Thread(target=_pump, args=(fd, chunks, stop), name="tshark-reader", daemon=True)
    pump.start()
    rest = b""
    try:
        while True:
            if on_idle is not None and chunks.empty():
                on_idle()
            data = chunks.get()
            if data is None:
                break
            if isinstance(data, BaseException):
                raise data
            lines = (rest + data).split(b"\n") if rest else data.split(b"\n")
            rest = lines.pop()
            yield from lines
        if rest:
            yield rest
    finally:
        stop.set()
        while pump.is_alive():  # unblock a put on a full queue; the read ends when tshark is gone
            try:
                chunks.get(timeout=0.05)
            except queue.Empty:
                pass


def read_packets(path: Path, keylog: Path | None, run: TsharkRun, *, tshark: str | None = None,
                 tls_ports: tuple[int, ...] = (), on_idle: Callable[[], object] | None = None) -> Iterator[Packet]:
    """Every TCP packet tshark reports, in capture order; ``run`` collects tshark's messages.
    ``on_idle``: called whenever the reader has caught up with tshark (work that can wait for it)."""
    exe = find_tshark(tshark)
    proc = subprocess.Popen(command(exe, path, keylog, tls_ports), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None and proc.stderr is not None
    drain = threading.Thread(target=_drain, args=(proc.stderr, run), daemon=True)
    drain.start()
    _widen_pipe(proc.stdout.fileno())
    finished = False
    lines = _lines(proc.stdout.fileno(), on_idle)
    try:
        for line in lines:
            layers = layers_of(line)
            if layers is None:
                raise IngestError(f"{path}: tshark wrote a line without its {len(FIELDS)} fields "
                                  f"({line[:80]!r}); nothing imported")
            pkt = parse_packet(layers)
            if pkt is not None:
                yield pkt
        finished = True
    finally:
        if not finished and proc.poll() is None:
            proc.terminate()  # the reader stopped early (an error): tshark need not finish the file
        lines.close()
        proc.stdout.close()
        run.returncode = proc.wait()
        drain.join(5)
