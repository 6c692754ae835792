"""Memory budget: peak RSS and time to import and read back a gzip-bomb flow file.

The file is what issue 12 measured: a mitmproxy flow file (written by mitmproxy's own
``FlowWriter``) holding one h2 ``Run`` whose response carries ``--frames`` gzip'd envelopes
(flag 0x01) that each inflate to ``--inflated-mb`` MiB (a ``text_delta`` of one repeated letter):
8 × 200 MiB in ~1.6 MB of file by default. Each command runs as its own process and its peak
RSS is read with ``getrusage(RUSAGE_CHILDREN)`` in a fresh wrapper process:

* ``import`` of the file (default inflate budgets: frames stay compressed);
* ``frames``, ``frames --json`` (inflates each frame on demand as a stream; ``--json-runs`` times,
  min/median/max printed), ``diagnose``,
  ``export --parquet`` on that database;
* baseline, same run: ``import`` of a plain flow file of about the same size (the same frames
  without gzip, ~200 KB each): what an ordinary 1.6 MB file costs;
* issue 20's importer bombs: a 42 KB flow file whose body has ``content-encoding: gzip`` and
  inflates to 40 MiB of zero bytes (millions of empty envelopes; stored as one ``compressed``
  frame), and a 407 KB ``.zhar`` that inflates to 400 MiB (refused, exit 2, naming the budget);
* for scale: ``import`` with the budgets raised past a smaller bomb (``--unbudgeted-mb`` per
  frame, default 25), which is what every import did before the budget.

The ratios printed are peak RSS and time of the bomb import over the plain-file baseline.

    python benchmarks/memory.py [--frames 8] [--inflated-mb 200] [--keep DIR]
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

from workbench.wire.varint import encode_varint

MIB = 1024 * 1024
RUN_PATH = "/agent.v1.AgentService/Run"
SESSION_KEY = "memory-bench-run"
# Runs one command with stdout/stderr in temporary files (never in this process's memory) and
# prints its exit code, wall time and peak RSS: the wrapper's only child is the command.
_WRAPPER = (
    "import resource, subprocess, sys, json, time, tempfile\n"
    "with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:\n"
    "    t = time.perf_counter()\n"
    "    rc = subprocess.run(sys.argv[1:], stdout=out, stderr=err).returncode\n"
    "    seconds = time.perf_counter() - t\n"
    "    err.seek(0)\n"
    "    print(json.dumps({'rc': rc, 'seconds': seconds,\n"
    "      'rss_kib': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,\n"
    "      'out_bytes': out.tell(), 'err': err.read()[-4000:].decode(errors='replace')}))\n"
)


def gzip_text_delta(n_bytes: int, letter: bytes = b"a") -> bytes:
    """gzip of an AgentServerMessage{interaction_update{text_delta{text: letter * n_bytes}}},
    streamed through zlib so the inflated message is never in memory."""
    text_delta = b"\x0a" + encode_varint(n_bytes)                      # TextDelta.text (1)
    inner_len = len(text_delta) + n_bytes
    update = b"\x0a" + encode_varint(inner_len)                        # InteractionUpdate.text_delta (1)
    head = b"\x0a" + encode_varint(len(update) + inner_len) + update + text_delta  # AgentServerMessage.interaction_update (1)
    comp = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    parts = [comp.compress(head)]
    chunk = letter * MIB
    left = n_bytes
    while left:
        piece = chunk if left >= MIB else chunk[:left]
        parts.append(comp.compress(piece))
        left -= len(piece)
    parts.append(comp.flush())
    return b"".join(parts)


def plain_text_delta(n_bytes: int, letter: bytes = b"a") -> bytes:
    """The same message as ``gzip_text_delta``, not compressed."""
    text_delta = b"\x0a" + encode_varint(n_bytes) + letter * n_bytes
    update = b"\x0a" + encode_varint(len(text_delta)) + text_delta
    return b"\x0a" + encode_varint(len(update)) + update


def build_flow_file(path: Path, frames: int = 8, inflated_mb: float = 200, *, gzip: bool = True,
                    plain_bytes: int = 0) -> Path:
    """Write a flow file with mitmproxy's FlowWriter: one h2 Run with ``frames`` server frames,
    gzip'd ones inflating to ``inflated_mb`` MiB each, or (``gzip=False``) plain ones of
    ``plain_bytes`` bytes each."""
    from mitmproxy import http, io
    from mitmproxy.test import tflow

    from workbench.wire.envelope import FLAG_COMPRESSED, FLAG_END_STREAM, encode

    body = bytearray()
    for i in range(frames):
        letter = b"abcdefgh"[i % 8:i % 8 + 1]
        if gzip:
            body += encode(gzip_text_delta(int(inflated_mb * MIB), letter), flags=FLAG_COMPRESSED)
        else:
            body += encode(plain_text_delta(plain_bytes, letter))
    body += encode(b"{}", flags=FLAG_END_STREAM)
    req = http.Request.make("POST", f"https://api2.cursor.sh{RUN_PATH}", b"",
                            {"content-type": "application/connect+proto", "connect-protocol-version": "1",
                             "x-request-id": SESSION_KEY})
    req.http_version = "HTTP/2.0"
    resp = http.Response.make(200, bytes(body), {"content-type": "application/connect+proto",
                                                 "connect-content-encoding": "gzip"})
    resp.http_version = "HTTP/2.0"
    flow = tflow.tflow(req=req, resp=resp)
    flow.id = SESSION_KEY
    with path.open("wb") as fh:
        io.FlowWriter(fh).add(flow)
    return path


def zero_stream(n_bytes: int, wbits: int = 16 + zlib.MAX_WBITS) -> bytes:
    """``n_bytes`` zero bytes compressed (gzip by default; ``zlib.MAX_WBITS`` for a zlib stream),
    streamed so the inflated bytes are never in memory: ~1 KB of output per MiB."""
    comp = zlib.compressobj(9, zlib.DEFLATED, wbits)
    chunk = bytes(MIB)
    parts = []
    left = n_bytes
    while left:
        piece = chunk if left >= MIB else chunk[:left]
        parts.append(comp.compress(piece))
        left -= len(piece)
    parts.append(comp.flush())
    return b"".join(parts)


def build_content_bomb(path: Path, inflated_mb: float = 40, coding: str = "gzip") -> Path:
    """A flow file (mitmproxy's FlowWriter) holding one h2 ``Run`` whose response body carries
    ``content-encoding: gzip`` (or ``coding``) and inflates to ``inflated_mb`` MiB of zero bytes:
    millions of empty envelopes once inflated. 40 MiB is a ~41 KB file (issue 20's 42 KB one)."""
    from mitmproxy import http, io
    from mitmproxy.test import tflow

    n = int(inflated_mb * MIB)
    if coding == "gzip":
        body = zero_stream(n)
    elif coding == "br":
        import brotli
        body = brotli.compress(bytes(n), quality=5)
    elif coding == "zstd":
        import zstandard
        body = zstandard.ZstdCompressor(level=3).compress(bytes(n))
    else:
        raise ValueError(f"no builder for {coding}")
    req = http.Request.make("POST", f"https://api2.cursor.sh{RUN_PATH}", b"",
                            {"content-type": "application/connect+proto", "connect-protocol-version": "1",
                             "x-request-id": SESSION_KEY})
    req.http_version = "HTTP/2.0"
    resp = http.Response.make(200, b"", {"content-type": "application/connect+proto", "content-encoding": coding})
    resp.raw_content = body  # as it crossed the wire: mitmproxy keeps bodies encoded
    resp.http_version = "HTTP/2.0"
    flow = tflow.tflow(req=req, resp=resp)
    flow.id = SESSION_KEY
    with path.open("wb") as fh:
        io.FlowWriter(fh).add(flow)
    return path


def build_zhar_bomb(path: Path, inflated_mb: float = 400) -> Path:
    """A ``.zhar`` (zlib, as mitmproxy writes it) holding a HAR whose one string is ``inflated_mb``
    MiB long: 400 MiB is a ~400 KB file (issue 20's 407 KB one)."""
    comp = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS)
    parts = [comp.compress(b'{"log": {"version": "1.2", "entries": [], "comment": "')]
    chunk = b"a" * MIB
    for _ in range(int(inflated_mb)):
        parts.append(comp.compress(chunk))
    parts.append(comp.compress(b'"}}'))
    parts.append(comp.flush())
    path.write_bytes(b"".join(parts))
    return path


def measure(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, object]:
    """Run ``cmd`` as a child of a fresh wrapper process: its exit code, seconds and peak RSS (KiB)."""
    out = subprocess.run([sys.executable, "-c", _WRAPPER, *cmd], capture_output=True, text=True,
                         env=env or os.environ.copy(), check=True)
    return dict(json.loads(out.stdout))


def workbench(*args: str) -> list[str]:
    return [sys.executable, "-m", "workbench.cli", *args]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=8)
    ap.add_argument("--inflated-mb", type=int, default=200)
    ap.add_argument("--unbudgeted-mb", type=float, default=25,
                    help="per-frame size of the smaller bomb imported with budgets raised (default 25)")
    ap.add_argument("--content-mb", type=float, default=40,
                    help="MiB of zeros the content-encoding bomb inflates to (default 40: a 42 KB flow file)")
    ap.add_argument("--zhar-mb", type=float, default=400,
                    help="MiB the .zhar bomb inflates to (default 400: a 407 KB file)")
    ap.add_argument("--keep", metavar="DIR", help="work in DIR and keep the files")
    ap.add_argument("--json-runs", type=int, default=3,
                    help="times `frames --json` is measured (min/median/max printed; default 3)")
    args = ap.parse_args()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="wb-memory-"))
    work.mkdir(parents=True, exist_ok=True)
    if not args.keep:
        atexit.register(shutil.rmtree, work, True)
    flows = work / "bomb.flows"
    t0 = time.perf_counter()
    build_flow_file(flows, args.frames, args.inflated_mb)
    print(f"flow file: {flows.stat().st_size / 1e6:.2f} MB, {args.frames} gzip frames × {args.inflated_mb} MiB "
          f"inflated (built in {time.perf_counter() - t0:.1f} s); load {os.getloadavg()[0]:.2f}")
    plain = build_flow_file(work / "plain.flows", args.frames, gzip=False,
                            plain_bytes=max(1, flows.stat().st_size // args.frames))
    small = build_flow_file(work / "small-bomb.flows", args.frames, args.unbudgeted_mb)
    raised = str(args.frames * args.unbudgeted_mb + 64)
    db = work / "budget.duckdb"
    rows: list[tuple[str, dict[str, object]]] = []
    rows.append(("import bomb (default budgets)", measure(workbench("import", str(flows), "--db", str(db)))))
    rows.append((f"import plain {plain.stat().st_size / 1e6:.1f} MB (baseline)",
                 measure(workbench("import", str(plain), "--db", str(work / "plain.duckdb")))))
    rows.append(("frames", measure(workbench("frames", SESSION_KEY, "--db", str(db)))))
    json_runs = [measure(workbench("frames", SESSION_KEY, "--json", "--db", str(db))) for _ in range(args.json_runs)]
    json_runs.sort(key=lambda r: int(str(r["rss_kib"])))
    rows.append(("frames --json (inflates on view)", json_runs[len(json_runs) // 2]))  # the median run
    rows.append(("diagnose", measure(workbench("diagnose", SESSION_KEY, "--no-write", "--db", str(db)))))
    rows.append(("export --parquet", measure(workbench("export", "--parquet", str(work / "pq"), "--db", str(db)))))
    # issue 20's two importer bombs: neither may inflate past the budgets
    cbomb = build_content_bomb(work / "content-bomb.flows", args.content_mb)
    zbomb = build_zhar_bomb(work / "bomb.zhar", args.zhar_mb)
    rows.append((f"import {cbomb.stat().st_size / 1e3:.0f} KB content-encoding bomb",
                 measure(workbench("import", str(cbomb), "--db", str(work / "content.duckdb")))))
    rows.append((f"import {zbomb.stat().st_size / 1e3:.0f} KB .zhar bomb (exit 2)",
                 measure(workbench("import", str(zbomb), "--db", str(work / "zhar.duckdb")))))
    bombs = rows[-2:]
    rows.append((f"import {args.frames}×{args.unbudgeted_mb:g} MiB bomb, no budget", measure(workbench(
        "import", str(small), "--db", str(work / "nobudget.duckdb"), "--inflate-frame-mb", str(args.unbudgeted_mb + 1),
        "--inflate-session-mb", raised, "--inflate-import-mb", raised))))
    print(f"{'command':38} {'rc':>3} {'seconds':>8} {'peak RSS MiB':>13}")
    for name, r in rows:
        print(f"{name:38} {r['rc']!s:>3} {float(str(r['seconds'])):8.2f} {int(str(r['rss_kib'])) / 1024:13.0f}")
        if r["rc"] not in (0, 1) and "bomb (exit 2)" not in name:
            print(f"    stderr: {str(r['err'])[-400:]}")
    budget, base = rows[0][1], rows[1][1]
    ratio_rss = int(str(budget["rss_kib"])) / max(1, int(str(base["rss_kib"])))
    ratio_t = float(str(budget["seconds"])) / max(1e-9, float(str(base["seconds"])))
    mb = flows.stat().st_size / 1e6
    print(f"bomb import: {mb / float(str(budget['seconds'])):.2f} MB/s of file; vs the plain-file baseline: "
          f"peak RSS {ratio_rss:.2f}×, time {ratio_t:.2f}×")
    print(f"database size after the bomb import: {db.stat().st_size / 1e6:.1f} MB")
    worst = max(int(str(r["rss_kib"])) for name, r in [*rows[:6], *bombs])
    from goals import load  # here, not at the top: tests load this file by path

    goals = load()
    print(goals.goal("read_back_rss").line(worst / 1024, f"worst {worst / 1024:.0f} MiB"))
    frames_json = int(str(rows[3][1]["rss_kib"])) / 1024
    spread = "/".join(f"{int(str(r['rss_kib'])) / 1024:.0f}" for r in (json_runs[0], json_runs[len(json_runs) // 2],
                                                                      json_runs[-1]))
    print(f"frames --json peak RSS min/median/max of {len(json_runs)} runs: {spread} MiB "
          f"({int(str(json_runs[0]['out_bytes'])) / 1e6:,.0f} MB of JSON each)")
    print(goals.goal("frames_json_rss").line(frames_json, f"{frames_json:.0f} MiB") + f"; load {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
