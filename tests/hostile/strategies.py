"""Hostile input for every source, as Hypothesis strategies, and the one traffic model they share.

One generated *exchange* is what an attacker (or a broken peer) can put on the wire for one agent
request: request headers with arbitrary bytes, a canary credential in every credential header and
in every credential field the schema has (plain and gzip'd per envelope), server envelopes (the
credentials the server hands a subagent), odd trailers, a reset, timestamps past year 9999. The
same exchanges are written as a flow file, a HAR (or ``.zhar``), sent live through mitmdump, …
so each source gets the same attack and the same invariants (``invariants.py``).

Credential sites are enumerated from the schema (every message with a ``credentials`` oneof,
reached from AgentClientMessage / AgentServerMessage) and credential headers from
``workbench.redact`` (its header list and suffix rule), not typed here by hand.

Example counts: each property declares a base count; ``WORKBENCH_HYPOTHESIS_EXAMPLES`` scales
them (``=0.5`` halves, ``=4`` quadruples; an integer ≥ 10 is taken as an absolute count for every
property). ``WORKBENCH_HYPOTHESIS_SHRINK=0`` skips shrinking (a failure is reported as found:
quicker in CI, where each example costs processes). The counts actually run are printed at the end of the session (``conftest.py``).
"""

from __future__ import annotations

import gzip
import os
import string
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, TypeVar

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from support import ci_run

from workbench import redact
from workbench.wire.envelope import FLAG_COMPRESSED, FLAG_END_STREAM, encode

F = TypeVar("F", bound=Callable[..., Any])

ENV_EXAMPLES = "WORKBENCH_HYPOTHESIS_EXAMPLES"
# =0: report the first failing example as found, without shrinking it (each example starts processes)
ENV_SHRINK = "WORKBENCH_HYPOTHESIS_SHRINK"
# Examples each property ran in this session (``tried``), printed by conftest.py.
RAN: Counter[str] = Counter()
PLANNED: dict[str, int] = {}

CLIENT_MSG = "agent.v1.AgentClientMessage"
SERVER_MSG = "agent.v1.AgentServerMessage"
RUN_PATH = "/agent.v1.AgentService/Run"
CANARY_PREFIX = "WBCANARY"
MIB = 1024 * 1024


def example_count(base: int) -> int:
    """``base`` examples in CI (``support.ci_run``), half of them (at least one) on a developer's run
    (README command 2: most of these examples start a process); ``$WORKBENCH_HYPOTHESIS_EXAMPLES``
    (a count, or a factor of ``base``) decides when set."""
    raw = os.environ.get(ENV_EXAMPLES, "").strip()
    if not raw:
        return base if ci_run() else max(1, (base + 1) // 2)
    value = float(raw)
    if value >= 10 and value.is_integer():
        return int(value)
    return max(1, round(base * value))


def hostile(base: int) -> Callable[[F], F]:
    """``@settings`` for a hostile property: ``base`` examples (scaled by the profile), no deadline
    (processes are slow on a loaded machine), health checks that only complain about slowness off."""
    n = example_count(base)

    def wrap(fn: F) -> F:
        PLANNED[fn.__name__] = n
        phases = list(Phase) if os.environ.get(ENV_SHRINK, "1") != "0" else [p for p in Phase if p != Phase.shrink]
        return settings(max_examples=n, deadline=None, derandomize=False, report_multiple_bugs=False,
                        phases=phases,
                        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                               HealthCheck.function_scoped_fixture,
                                               HealthCheck.large_base_example])(fn)

    return wrap


def tried(name: str) -> None:
    """Count one example of property ``name`` (called first thing in its body)."""
    RAN[name] += 1


# ------------------------------------------------------------------ credential sites (schema) --

@dataclass(frozen=True)
class Site:
    """One place a credential can sit: root message, path of fields to the holder, oneof variant."""

    root: str
    path: tuple[str, ...]
    variant: str
    fields: tuple[str, ...]  # secret string fields of the variant

    @property
    def name(self) -> str:
        return f"{self.root.rsplit('.', 1)[-1]}.{'.'.join(self.path)}.{self.variant}"


def _schema() -> Any:
    from workbench.decode.classify import default_decoder

    return default_decoder().schema


@lru_cache(maxsize=1)
def credential_sites() -> tuple[Site, ...]:
    """Every (path, credentials variant) under the two agent roots, from the schema."""
    sites: list[Site] = []
    oneof = redact._CREDENTIAL_ONEOF
    not_secret = redact._NOT_SECRET

    def walk(root: str, desc: Descriptor, path: tuple[str, ...], on_path: frozenset[str]) -> None:
        if oneof in desc.oneofs_by_name:
            for fd in desc.oneofs_by_name[oneof].fields:
                names = tuple(f.name for f in fd.message_type.fields
                              if f.type == FieldDescriptor.TYPE_STRING and f.name not in not_secret)
                if names:
                    sites.append(Site(root, path, fd.name, names))
        if len(path) >= 6:
            return
        for fd in desc.fields:
            if fd.type != FieldDescriptor.TYPE_MESSAGE or fd.message_type.GetOptions().map_entry:
                continue
            if fd.containing_oneof is not None and fd.containing_oneof.name == oneof:
                continue
            if fd.message_type.full_name in on_path:
                continue
            walk(root, fd.message_type, (*path, fd.name), on_path | {fd.message_type.full_name})

    schema = _schema()
    for root in (CLIENT_MSG, SERVER_MSG):
        walk(root, schema.message_class(root).DESCRIPTOR, (), frozenset({root}))
    assert sites, "the schema has no credentials oneof: the canary properties would test nothing"
    return tuple(sites)


def credential_message(site: Site, canary: str) -> bytes:
    """A root message with ``canary`` (suffixed by field name) in every secret field at ``site``."""
    msg = _schema().message_class(site.root)()
    holder: Any = msg
    for name in site.path:
        fd = holder.DESCRIPTOR.fields_by_name[name]
        holder = getattr(holder, name).add() if fd.is_repeated else getattr(holder, name)
    cred = getattr(holder, site.variant)
    for name in site.fields:
        setattr(cred, name, f"{canary}-{name}")
    return bytes(msg.SerializeToString())


SUFFIXES = ("token", "secret", "api-key", "password")


@lru_cache(maxsize=1)
def secret_header_names() -> tuple[str, ...]:
    """Every credential header ``redact`` names, plus one per suffix its rule hides."""
    names = sorted(redact.SECRET_HEADERS) + [f"x-hostile-{s}" for s in SUFFIXES]
    assert all(redact.is_secret_header(n) for n in names)
    return tuple(names)


def secret_header_value(name: str, canary: str) -> str:
    if name == "authorization":
        return f"Bearer {canary}-auth"
    if name in ("cookie", "set-cookie"):
        return f"session={canary}-cookie; theme=dark"
    return f"{canary}-{name}"


# --------------------------------------------------------------------------- raw strategies --

canaries = st.text(alphabet=string.ascii_uppercase + string.digits, min_size=12, max_size=12).map(
    lambda s: CANARY_PREFIX + s)

# Bytes that are not UTF-8 (or UTF-8 that Python only round-trips with surrogates), as the issue found.
NON_UTF8 = [b"caf\xe9 down", b"1.0\xff", b"\xed\xa0\x80", b"\xc3(", b"\x80\x81\x82", b"ok\xfe\xfe"]


def header_bytes(*, allow_ctl: bool = True) -> st.SearchStrategy[bytes]:
    """A header value: arbitrary bytes (no CR/LF/NUL, which no HTTP stack lets through) mixed
    with known non-UTF-8 values."""
    bad = {0, 10, 13} if allow_ctl else set(range(32)) | {127}
    arbitrary = st.binary(min_size=0, max_size=40).map(lambda b: bytes(c for c in b if c not in bad))
    return st.one_of(st.sampled_from(NON_UTF8), arbitrary)


@dataclass
class Exchange:
    """One generated agent request and its answer (see module doc)."""

    canary: str
    secret_headers: list[str]
    odd_headers: list[tuple[bytes, bytes]]          # name, value: arbitrary bytes
    client_sites: list[Site]
    server_sites: list[Site]
    gzip_client: list[bool]
    gzip_server: list[bool]
    trailers: list[tuple[bytes, bytes]]
    reset: bool
    timestamp: float
    path_suffix: bytes = b""
    grpc_message: bytes | None = None
    text_frames: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def client_envelopes(self) -> list[bytes]:
        return [encode(credential_message(s, self.canary), compress=z)
                for s, z in zip(self.client_sites, self.gzip_client, strict=True)]

    def server_envelopes(self) -> list[bytes]:
        out = [encode(credential_message(s, self.canary), compress=z)
               for s, z in zip(self.server_sites, self.gzip_server, strict=True)]
        out += [encode(text_delta(f"text {i}")) for i in range(self.text_frames)]
        if not self.reset:
            out.append(encode(b"{}", FLAG_END_STREAM))
        return out

    @property
    def frames_in(self) -> int:
        """Envelopes that went in (each one must be a stored frame, or be reported lost)."""
        return len(self.client_sites) + len(self.server_sites) + self.text_frames + (0 if self.reset else 1)

    def request_headers(self) -> list[tuple[bytes, bytes]]:
        hs = [(b"content-type", b"application/connect+proto"), (b"connect-protocol-version", b"1")]
        hs += [(n.encode(), secret_header_value(n, self.canary).encode()) for n in self.secret_headers
               if n != "set-cookie"]
        return hs + self.odd_headers

    def response_headers(self) -> list[tuple[bytes, bytes]]:
        hs = [(b"content-type", b"application/connect+proto")]
        if "set-cookie" in self.secret_headers:
            hs.append((b"set-cookie", secret_header_value("set-cookie", self.canary).encode()))
        if self.grpc_message is not None:
            hs.append((b"grpc-message", self.grpc_message))
        return hs


def text_delta(text: str) -> bytes:
    from workbench.schema import pb

    return bytes(pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(
        text_delta=pb.TextDelta(text=text))).SerializeToString())


# Wire timestamps: ordinary ones, and the edges an importer must survive (year 10000 and later,
# before 1970, sub-microsecond).
YEAR_10000 = 253402300800.0
timestamps = st.one_of(
    st.floats(min_value=1.6e9, max_value=1.9e9),
    st.floats(min_value=YEAR_10000, max_value=1e15),
    st.floats(min_value=-6.2e10, max_value=0.0),  # before 1970, after year 1
)


def out_of_range(ts: float) -> bool:
    """A timestamp no datetime type holds (year 10000 or later): the one input here an importer
    may refuse (exit 2 naming the file) instead of storing."""
    return ts >= YEAR_10000
trailer_names = st.one_of(st.sampled_from([b"grpc-status", b"grpc-message", b"x-odd", b"content-length"]),
                          st.binary(min_size=1, max_size=12).map(
                              lambda b: bytes(c for c in b.lower() if 0x21 <= c < 0x7F and c != ord(":")) or b"x"))


def exchanges(*, wire_safe: bool = False, timestamps_too: bool = True) -> st.SearchStrategy[Exchange]:
    """One hostile exchange. ``wire_safe``: only what an HTTP/2 peer can really send (header names
    lower-case tokens; values without CR/LF/NUL), for the live capture."""
    sites = credential_sites()
    client = [s for s in sites if s.root == CLIENT_MSG]
    server = [s for s in sites if s.root == SERVER_MSG]
    token_name = st.text(alphabet=string.ascii_lowercase + string.digits + "-", min_size=1, max_size=16).map(
        lambda s: "x-h-" + s)
    odd_value = header_bytes(allow_ctl=not wire_safe)

    @st.composite
    def build(draw: st.DrawFn) -> Exchange:
        canary = draw(canaries)
        cs = draw(st.lists(st.sampled_from(client), min_size=1, max_size=4))
        ss = draw(st.lists(st.sampled_from(server), min_size=0, max_size=3))
        odd = draw(st.lists(st.tuples(token_name.map(str.encode), odd_value), max_size=4))
        return Exchange(
            canary=canary,
            secret_headers=draw(st.lists(st.sampled_from(secret_header_names()), min_size=1, unique=True)),
            odd_headers=odd,
            client_sites=cs,
            server_sites=ss,
            gzip_client=draw(st.lists(st.booleans(), min_size=len(cs), max_size=len(cs))),
            gzip_server=draw(st.lists(st.booleans(), min_size=len(ss), max_size=len(ss))),
            trailers=draw(st.lists(st.tuples(trailer_names, odd_value), max_size=3)),
            reset=draw(st.booleans()),
            timestamp=draw(timestamps) if timestamps_too else draw(st.floats(min_value=1.6e9, max_value=1.9e9)),
            path_suffix=b"" if wire_safe else draw(st.sampled_from([b"", b"?q=\xff", b"/\xe9"])),
            grpc_message=draw(st.one_of(st.none(), odd_value)),
            text_frames=draw(st.integers(0, 3)),
        )

    return build()


# ------------------------------------------------------------------------------- bombs, nesting --

@lru_cache(maxsize=4)
def gzip_zeros(inflated_mib: int) -> bytes:
    """A gzip member of ``inflated_mib`` MiB of zeros (≈1/1000 of that on disk)."""
    comp = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = bytes(MIB)
    out = [comp.compress(chunk) for _ in range(inflated_mib)]
    out.append(comp.flush())
    return b"".join(out)


@lru_cache(maxsize=4)
def zlib_json_bomb(inflated_mib: int) -> bytes:
    """A zlib stream (mitmproxy's ``.zhar``) of a HAR whose one string is ``inflated_mib`` MiB."""
    comp = zlib.compressobj(9)
    out = [comp.compress(b'{"log": {"version": "1.2", "entries": [], "comment": "')]
    chunk = b"A" * MIB
    out += [comp.compress(chunk) for _ in range(inflated_mib)]
    out.append(comp.compress(b'"}}'))
    out.append(comp.flush())
    return b"".join(out)


BOMB_MIB = (1536, 2048)
bomb_sizes = st.sampled_from(BOMB_MIB)
RSS_BUDGET_KIB = 1024 * 1024  # 1 GiB: the README's "Memory" section (benchmarks/memory.py)
DEPTHS = (1000, 100_000)
depths = st.sampled_from(DEPTHS)


def gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


__all__ = ["BOMB_MIB", "CANARY_PREFIX", "CLIENT_MSG", "DEPTHS", "FLAG_COMPRESSED", "MIB", "NON_UTF8", "RAN",
           "RSS_BUDGET_KIB", "RUN_PATH", "SERVER_MSG", "Exchange", "Site", "bomb_sizes", "canaries",
           "credential_message", "credential_sites", "depths", "example_count", "exchanges", "gz", "gzip_zeros",
           "header_bytes", "hostile", "out_of_range", "secret_header_names", "secret_header_value", "text_delta", "timestamps",
           "tried", "zlib_json_bomb"]


# ------------------------------------------------------------------------- stream-json NDJSON --

@dataclass
class NdjsonLine:
    data: bytes
    refusable: bool  # nested past any JSON parser's depth, or a time no datetime holds


def ndjson_lines(session_id: str) -> st.SearchStrategy[NdjsonLine]:
    """One stream-json line as ``cursor-agent --output-format stream-json`` prints it, made hostile:
    arbitrary text (lone surrogates escaped as JSON allows), ``timestamp_ms`` at and past the edges
    of every time type, deep nesting, bytes that are not UTF-8 or not JSON."""
    import json

    text = st.text(max_size=40)
    ms = st.one_of(st.integers(1_600_000_000_000, 1_900_000_000_000),
                   st.integers(int(YEAR_10000 * 1000), 2**63 - 1), st.integers(-(2**63), -1),
                   st.sampled_from([10**30, 1e308, float("inf"), float("nan")]))

    def event(kind: str, body: str, t: int | float) -> NdjsonLine:
        doc: dict[str, Any] = {"type": kind, "session_id": session_id, "timestamp_ms": t}
        if kind == "assistant":
            doc["message"] = {"role": "assistant", "content": [{"type": "text", "text": body}]}
        else:
            doc.update(subtype="delta", text=body)
        bad = isinstance(t, float) or not (0 <= t < YEAR_10000 * 1000)
        return NdjsonLine(json.dumps(doc).encode(), bad)

    def deep(depth: int) -> NdjsonLine:
        head = f'{{"type":"assistant","session_id":"{session_id}","message":'.encode()
        return NdjsonLine(head + b"[" * depth + b"]" * depth + b"}", True)

    garbage = st.binary(min_size=1, max_size=30).map(
        lambda b: NdjsonLine(bytes(c for c in b if c != 10).strip() or b"\xff", False))
    return st.one_of(st.builds(event, st.sampled_from(["assistant", "thinking"]), text, ms),
                     depths.map(deep), garbage)


__all__ += ["NdjsonLine", "ndjson_lines"]


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


def nested_protobuf(depth: int) -> bytes:
    """Field 1 (length-delimited) nested ``depth`` deep, built without quadratic copying."""
    lengths = [0]
    for _ in range(depth):
        lengths.append(1 + len(_varint(lengths[-1])) + lengths[-1])
    return b"".join(b"\x0a" + _varint(lengths[i]) for i in range(depth - 1, -1, -1))


# SQL literals whose printing has broken before (infinities), and the other edges of DuckDB's types.
SQL_LITERALS = [
    "'infinity'::timestamp", "'-infinity'::timestamp", "'infinity'::date", "'-infinity'::date",
    "'infinity'::timestamptz", "'294247-01-10 04:00:54'::timestamp", "'5877642-06-25 (BC)'::date",
    "'nan'::double", "'inf'::double", "'-inf'::float", "170141183460469231731687303715884105727::hugeint",
    "(-170141183460469231731687303715884105727)::hugeint", "18446744073709551615::ubigint",
    "99999999999999999999999999999999999.999::decimal(38,3)", "interval 178000000 years",
    "'\\x00\\xff'::blob", "chr(0)", "chr(27) || '[31mred'", "'\\ud800'", "NULL::json", "'{\"a\": [1, 2]}'::json",
    "[[[[[[[[1]]]]]]]]", "{'a': {'b': {'c': NULL}}}", "map([1, 2], ['x', 'y'])", "'1e400'::json",
    "gen_random_uuid()", "'12:00:00+15:59'::timetz", "'24:00:00'::time", "union_value(k := 1)",
    "'\\u202e' || 'abc'", "[]::int[]", "repeat('x', 100000)", "to_timestamp(9.2e12)",
]
sql_literals = st.lists(st.sampled_from(SQL_LITERALS), min_size=1, max_size=6)

__all__ += ["SQL_LITERALS", "nested_protobuf", "sql_literals"]
