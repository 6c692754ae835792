"""Seeded mutation of real import files (flow, HAR, stream-json): never a traceback, a clear error
naming the file (and flow, entry or line) when a file cannot be imported, and nothing valid lost
when it can. The files start as ``tests/ingest/data`` samples, which a real mitmdump recorded.

Budget: 30 mutants per kind below (flow file bytes, flow bodies, HAR structure, HAR bytes,
stream-json), each imported with ``workbench import`` into a fresh database.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from import_files import DATA, SAMPLE_FLOWS, SAMPLE_NDJSON
from mitmproxy import io
from support import query_rows

from workbench.cli import main
from workbench.ingest.har import entry_hash

CASES = 30
AGENT_PREFIXES = ("/agent.v1.", "/aiserver.v1.")


def mutate(rng: random.Random, data: bytes) -> bytes:
    """One to three byte-level edits: flips, deletions, insertions, duplications, truncation."""
    b = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        if not b:
            b += rng.randbytes(rng.randint(1, 16))
            continue
        op = rng.choice(("flip", "delete", "insert", "dup", "truncate", "zero"))
        i = rng.randrange(len(b))
        if op == "flip":
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        elif op == "delete":
            del b[i:i + rng.randint(1, 64)]
        elif op == "insert":
            b[i:i] = rng.randbytes(rng.randint(1, 64))
        elif op == "dup":
            b[i:i] = b[i:i + rng.randint(1, 256)]
        elif op == "truncate":
            del b[i:]
        else:
            b[i:i + rng.randint(1, 32)] = bytes(rng.randint(1, 32))
    return bytes(b)


def _import(path: Path, db: Path, capsys: pytest.CaptureFixture[str], fmt: str | None = None) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(["import", str(path), "--db", str(db), *(["--format", fmt] if fmt else [])])
    err = capsys.readouterr().err
    assert rc in (0, 2), rc
    if rc == 2:
        assert f"workbench import: {path}" in err, err  # the error names the file
        assert "Traceback" not in err
    return rc, err


def _consistent(db: Path) -> None:
    """Whatever was imported is whole: counts agree, keys are unique, bad frames keep bytes and say why."""
    rows = query_rows(db, "SELECT s.session_id, s.frame_count, count(f.seq) AS n FROM sessions s "
                  "LEFT JOIN frames f USING (session_id) GROUP BY ALL")
    assert all(r["frame_count"] == r["n"] for r in rows)
    keys = [r["source_key"] for r in query_rows(db, "SELECT source_key FROM frames")]
    assert len(set(keys)) == len(keys)
    for r in query_rows(db, "SELECT kind, error, payload, raw FROM frames WHERE kind = 'malformed'"):
        assert r["error"] and (r["payload"] or r["raw"])


@pytest.mark.parametrize("seed", range(CASES))
def test_mutated_flow_file_bytes(seed: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(seed)
    path = tmp_path / "m.flows"
    path.write_bytes(mutate(rng, SAMPLE_FLOWS.read_bytes()))
    db = tmp_path / "m.duckdb"
    rc, err = _import(path, db, capsys, fmt="flow")
    if rc == 2:
        assert ("flow " in err and "nothing imported" in err) or "empty file" in err, err
        assert query_rows(db, "SELECT count(*) AS n FROM frames")[0]["n"] == 0  # a file is imported whole or not at all
    else:
        _consistent(db)


def _mutate_flow(rng: random.Random, f: Any) -> None:
    for msg in (f.request, f.response):
        if msg is None or rng.random() < 0.4:
            continue
        if msg.raw_content:
            msg.raw_content = mutate(rng, msg.raw_content)
        r = rng.random()
        if r < 0.1:
            msg.headers["content-encoding"] = rng.choice(["gzip", "br", "deflate", "zstd", "bogus"])
        elif r < 0.2:
            msg.headers["content-type"] = rng.choice(["application/grpc-web+proto", "text/plain", "application/json"])
    if rng.random() < 0.1:
        f.response = None


@pytest.mark.parametrize("seed", range(CASES))
def test_mutated_flow_bodies(seed: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A valid flow file with damaged bodies and headers imports, and every agent flow is in it."""
    rng = random.Random(1000 + seed)
    with SAMPLE_FLOWS.open("rb") as fh:
        flows = list(io.FlowReader(fh).stream())
    for f in flows:
        _mutate_flow(rng, f)
    path = tmp_path / "b.flows"
    with path.open("wb") as fh:
        w = io.FlowWriter(fh)
        for f in flows:
            w.add(f)
    db = tmp_path / "b.duckdb"
    rc, err = _import(path, db, capsys)
    assert rc == 0, err
    _consistent(db)
    units = {r["u"] for r in query_rows(db, "SELECT DISTINCT regexp_replace(source_key, '#[0-9]+$', '') AS u FROM frames")}
    for f in flows:
        has_body = bool(f.request.raw_content) or bool(f.response is not None and f.response.raw_content)
        if f.request.path.startswith(AGENT_PREFIXES) and has_body:
            assert f"flow:{f.id}" in units, f"flow {f.id} {f.request.path} lost"


def _mutate_json(rng: random.Random, node: Any, depth: int = 0) -> Any:
    """Replace, delete or retype one value somewhere under ``node`` (in place where possible)."""
    junk = [None, 0, -1, 1.5, "", "x", "\ufffd\x00", [], {}, True, "2026-13-45T99:00:00Z", "%%%not base64%%%"]
    if isinstance(node, dict) and node and depth < 8:
        key = rng.choice(list(node))
        r = rng.random()
        if r < 0.25:
            del node[key]
        elif r < 0.5:
            node[key] = rng.choice(junk)
        else:
            node[key] = _mutate_json(rng, node[key], depth + 1)
        return node
    if isinstance(node, list) and node and depth < 8:
        i = rng.randrange(len(node))
        r = rng.random()
        if r < 0.2:
            del node[i]
        elif r < 0.3:
            node.insert(i, rng.choice(junk))
        else:
            node[i] = _mutate_json(rng, node[i], depth + 1)
        return node
    if isinstance(node, str) and node and rng.random() < 0.7:
        cut = rng.randrange(len(node))
        return node[:cut] + rng.choice(["", "\ufffd", "\x00", "é", node[cut:cut + 40]])
    return rng.choice(junk)


def _exchanges_recorded(db: Path) -> set[str]:
    """Every HAR entry a session names: its own exchange, or an append joined to a stream."""
    out = set()
    for r in query_rows(db, "SELECT meta FROM sessions"):
        meta = json.loads(r["meta"])
        out.add(meta.get("exchange"))
        out.update(a.get("exchange") for a in meta.get("appends", []))
    return out


@pytest.mark.parametrize("seed", range(CASES))
def test_mutated_har_structure(seed: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(2000 + seed)
    doc = json.loads((DATA / "agent.har").read_text())
    entries = doc["log"]["entries"]
    for _ in range(rng.randint(1, 4)):
        _mutate_json(rng, entries if rng.random() < 0.8 else doc)
    path = tmp_path / "m.har"
    path.write_text(json.dumps(doc))
    db = tmp_path / "m.duckdb"
    rc, err = _import(path, db, capsys, fmt="har")
    if rc == 2:
        assert any(w in err for w in ("entry ", "log.entries", "not valid JSON", "not a HAR")), err
        assert query_rows(db, "SELECT count(*) AS n FROM frames")[0]["n"] == 0
        return
    _consistent(db)
    entries = doc["log"]["entries"]  # imported: the file still has a log.entries list
    recorded = _exchanges_recorded(db)
    seen: set[str] = set()
    for n, e in enumerate(entries, 1):
        url = e["request"].get("url") if isinstance(e, dict) and isinstance(e.get("request"), dict) else None
        path_part = url.split("://", 1)[-1].partition("/")[2] if isinstance(url, str) else ""
        h = entry_hash(e)
        if ("/" + path_part).startswith(AGENT_PREFIXES) and h not in seen:
            assert f"entry {n}" in recorded, f"entry {n} lost"
        seen.add(h)


@pytest.mark.parametrize("seed", range(CASES))
def test_mutated_har_bytes(seed: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(3000 + seed)
    path = tmp_path / "b.har"
    path.write_bytes(mutate(rng, (DATA / "agent.har").read_bytes()))
    db = tmp_path / "b.duckdb"
    rc, err = _import(path, db, capsys, fmt="har")
    if rc == 0:
        _consistent(db)


def _mutate_lines(rng: random.Random, lines: list[bytes]) -> list[bytes]:
    out = list(lines)
    for _ in range(rng.randint(1, 6)):
        i = rng.randrange(len(out))
        op = rng.choice(("bytes", "bytes", "blank", "crlf", "split", "join", "latin1", "array", "huge"))
        if op == "bytes":
            out[i] = mutate(rng, out[i])
        elif op == "blank":
            out.insert(i, rng.choice([b"", b"   ", b"\t"]))
        elif op == "crlf":
            out[i] += b"\r"
        elif op == "split":
            cut = rng.randrange(len(out[i]) + 1)
            out[i:i + 1] = [out[i][:cut], out[i][cut:]]
        elif op == "join" and i + 1 < len(out):
            out[i:i + 2] = [out[i] + out[i + 1]]
        elif op == "latin1":
            out[i] = out[i].replace(b"the", b"th\xe9\xff")
        elif op == "array":
            out.insert(i, rng.choice([b"[1, 2]", b"42", b'"text"', b"null", b'{"no_type": 1}', b"{"]))
        else:
            out.insert(i, b'{"type":"assistant","message":"' + b"x" * rng.randint(10_000, 200_000) + b'"}')
    return [line.replace(b"\n", b" ") for line in out]


@pytest.mark.parametrize("seed", range(CASES))
def test_mutated_stream_json(seed: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every non-blank line is stored exactly (as an event or a malformed frame naming its line)."""
    rng = random.Random(4000 + seed)
    lines = _mutate_lines(rng, SAMPLE_NDJSON.read_bytes().splitlines())
    path = tmp_path / "m.ndjson"
    path.write_bytes(b"\n".join(lines) + b"\n")
    db = tmp_path / "m.duckdb"
    rc, err = _import(path, db, capsys, fmt="ndjson")
    assert rc == 0, err
    _consistent(db)
    stored = Counter(r["payload"] for r in query_rows(db, "SELECT payload FROM frames"))
    kept = [ln for ln in lines if ln.rstrip(b"\r").strip()]
    assert stored == Counter(kept)
    for r in query_rows(db, "SELECT summary, error FROM frames WHERE kind = 'malformed'"):
        assert r["error"].startswith("line ")
