"""The invariants every hostile property asserts, whatever the source.

(a) ``clean_exit``: exit 0 or 1, or 2 with a message naming the input; never a traceback.
(b) ``all_frames_accounted``: every frame that went in is stored, or the run said it was lost.
(c) ``canary_nowhere``: a planted credential is on no file under the test's folder (database
    bytes *and* its tables read back with every blob inflated, WAL, spools, sidecars, logs,
    Parquet exports read back, fixtures gunzipped) nor in any view's output.
(d) peak RSS under the budget: ``support.run_measured`` reads the child's ``ru_maxrss``.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
import re
import subprocess
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

# How much one stored blob may inflate to while we look inside it (a stored bomb must not take
# the test down; a credential is within the first bytes of what we plant).
SCAN_INFLATE_LIMIT = 64 * 1024 * 1024


def clean_exit(proc: subprocess.CompletedProcess[str] | dict[str, Any], inputs: Sequence[str | Path],
               what: str = "") -> None:
    """(a): 0/1, or 2 naming one of ``inputs``; no "Traceback" on stderr."""
    rc = proc["rc"] if isinstance(proc, dict) else proc.returncode
    err = proc["err"] if isinstance(proc, dict) else proc.stderr
    label = what or "command"
    assert "Traceback" not in err, f"{label} printed a traceback (rc {rc}):\n{err[-3000:]}"
    assert rc in (0, 1, 2), f"{label} exited {rc} (killed or crashed):\n{err[-3000:]}"
    if rc == 2:
        assert any(str(p) in err for p in inputs), \
            f"{label} exited 2 without naming its input ({[str(p) for p in inputs]}):\n{err[-2000:]}"


def needles(canary: str) -> list[bytes]:
    """The canary as it could sit in a file: plain, hex (BidiAppend), base64 at each alignment."""
    raw = canary.encode()
    out = [raw, binascii.hexlify(raw), binascii.hexlify(raw).upper()]
    for k in range(3):
        enc = base64.b64encode(b"\0" * k + raw)
        start = 4 * ((k + 2) // 3)
        end = 4 * ((k + len(raw)) // 3)
        if end - start >= 12:
            out.append(enc[start:end])
    return out


def _inflations(blob: bytes) -> Iterable[bytes]:
    """Every gzip/zlib stream that starts somewhere in ``blob``, inflated up to the scan limit."""
    for magic, wbits in ((b"\x1f\x8b", 16 + zlib.MAX_WBITS), (b"\x78", zlib.MAX_WBITS)):
        start = blob.find(magic)
        seen = 0
        while start >= 0 and seen < 64:
            seen += 1
            try:
                d = zlib.decompressobj(wbits)
                yield d.decompress(blob[start:], SCAN_INFLATE_LIMIT)
            except zlib.error:
                pass
            start = blob.find(magic, start + 1)


_BASE64_RUN = re.compile(rb"[A-Za-z0-9+/_-]{24,}={0,2}")
_HEX_RUN = re.compile(rb"(?:[0-9a-fA-F]{2}){12,}")


def _decodings(blob: bytes) -> Iterable[bytes]:
    """Base64 and hex runs in ``blob``, decoded: a fixture or a JSON view keeps a (possibly gzip'd)
    payload as base64 or hex text, where the needles alone would not see inside the gzip."""
    for m in _BASE64_RUN.finditer(blob):
        run = m.group()
        try:
            yield base64.b64decode(run + b"=" * (-len(run) % 4), altchars=b"-_" if b"-" in run or b"_" in run else None)
        except (binascii.Error, ValueError):
            pass
    for m in _HEX_RUN.finditer(blob):
        yield binascii.unhexlify(m.group())


def found_in(blob: bytes, canary: str, depth: int = 0) -> bool:
    """Whether ``canary`` can be read from ``blob``: as is, hex or base64, or inside a gzip/zlib
    stream or a base64/hex run in it (two levels deep)."""
    ns = needles(canary)
    if any(n in blob for n in ns):
        return True
    if depth < 2:
        return any(found_in(inner, canary, depth + 1) for inner in (*_inflations(blob), *_decodings(blob)))
    return False


def _table_hits(db: Path, canary: str) -> list[str]:
    """Rows of any table of a DuckDB file holding the canary (every column, blobs inflated)."""
    import duckdb

    hits: list[str] = []
    con = duckdb.connect(str(db), read_only=True)
    try:
        tables = [r[0] for r in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'").fetchall()]
        for table in tables:
            cols = con.execute(f'SELECT column_name, data_type FROM information_schema.columns '
                               f"WHERE table_name = '{table}' AND table_schema = 'main'").fetchall()
            for name, dtype in cols:
                cur = con.execute(f'SELECT "{name}" FROM "{table}" WHERE "{name}" IS NOT NULL')
                while batch := cur.fetchmany(500):
                    for (value,) in batch:
                        blob = value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogatepass")
                        if found_in(blob, canary):
                            hits.append(f"{db.name}: {table}.{name} ({dtype})")
                            break
                    else:
                        continue
                    break
    finally:
        con.close()
    return hits


def _parquet_hits(path: Path, canary: str) -> list[str]:
    import duckdb

    con = duckdb.connect()
    try:
        rel = con.execute(f"SELECT * FROM read_parquet('{path}')")
        names = [d[0] for d in rel.description]
        while batch := rel.fetchmany(500):
            for row in batch:
                for name, value in zip(names, row, strict=True):
                    if value is None:
                        continue
                    blob = value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogatepass")
                    if found_in(blob, canary):
                        return [f"{path}: column {name}"]
    finally:
        con.close()
    return []


def _is_duckdb(data_head: bytes) -> bool:
    return data_head[8:12] == b"DUCK"


def disk_hits(root: Path, canary: str) -> list[str]:
    """Every place under ``root`` the canary can be read from (see module doc)."""
    hits: list[str] = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if found_in(data, canary):
            hits.append(f"{path.relative_to(root)}: file bytes")
            continue
        if _is_duckdb(data[:16]):
            try:
                hits += [f"{path.relative_to(root)}: {h}" for h in _table_hits(path, canary)]
            except Exception as exc:  # a database being written or damaged: its bytes were scanned
                if "lock" not in str(exc).lower():
                    hits.append(f"{path.relative_to(root)}: cannot be read back to scan ({exc})")
        elif data[:4] == b"PAR1":
            hits += _parquet_hits(path, canary)
        elif data[:2] == b"\x1f\x8b":
            try:
                if found_in(gzip.decompress(data), canary):
                    hits.append(f"{path.relative_to(root)}: gunzipped")
            except (OSError, EOFError, zlib.error):
                pass
    return hits


def _json_lines(text: str) -> list[dict[str, Any]]:
    text = text.strip()
    if not text:
        return []
    if text.startswith("["):
        doc = json.loads(text)
        return doc if isinstance(doc, list) else [doc]
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def run_in_process(*args: str) -> dict[str, Any]:
    """``workbench ARGS`` through ``workbench.cli.main`` in this process (the views run once per
    example; a process each would make the suite minutes longer). An exception escaping ``main``
    is what a user would see as a traceback: it is reported as one."""
    import contextlib
    import io
    import traceback

    from workbench.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(args))
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 2
        except BaseException:
            err.write(traceback.format_exc())
            rc = 99
    return {"rc": rc, "out": out.getvalue(), "err": err.getvalue()}


def view_outputs(db: Path, out_dir: Path, *, max_sessions: int = 3) -> dict[str, str]:
    """What the read views print for the database (``sessions --json``, ``frames --json`` of up to
    ``max_sessions`` sessions, ``diagnose --all --json``) and what ``export --parquet`` and
    ``export-fixture --all`` write under ``out_dir`` (scanned with the folder). Each view must
    exit cleanly too (a)."""
    outputs: dict[str, str] = {}

    def view(label: str, *args: str) -> str:
        r = run_in_process(*args, "--db", str(db))
        clean_exit(r, [db], label)
        outputs[label] = r["out"] + r["err"]
        return str(r["out"]) if r["rc"] == 0 else ""

    ids = [s["session_id"] for s in _json_lines(view("sessions --json", "sessions", "--json"))]
    for sid in ids[:max_sessions]:
        view(f"frames --json {sid}", "frames", sid, "--json")
        view(f"frames {sid}", "frames", sid)
    view("diagnose --all --json", "diagnose", "--all", "--json")
    if ids:
        view("export --parquet", "export", "--parquet", str(out_dir / "parquet"))
        view("export-fixture --all", "export-fixture", "--all", "-o", str(out_dir / "fixtures"))
    return outputs


def canary_nowhere(root: Path, canary: str, outputs: dict[str, str] | None = None) -> None:
    """(c) for everything under ``root`` and every captured output."""
    hits = disk_hits(root, canary)
    for label, text in (outputs or {}).items():
        if found_in(text.encode("utf-8", "surrogatepass"), canary):
            hits.append(f"output of `{label}`")
    assert not hits, f"credential canary {canary} found in clear: " + "; ".join(hits)


def stored_frames(db: Path) -> dict[str, int]:
    """Frames stored per session, read with DuckDB directly (the process that wrote them is gone)."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute("SELECT session_id, count(*) FROM frames GROUP BY 1").fetchall()
        return {str(sid): int(n) for sid, n in rows}
    finally:
        con.close()


def query(db: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, list(params)).fetchall()
    finally:
        con.close()
