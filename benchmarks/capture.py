"""Capture overhead: per-frame latency added by the addon, and frames/s recorded under a flood.

    python benchmarks/capture.py [--rounds 300] [--passes 3] [--flood 50000] [--line PYTHON ...]

Each supported mitmproxy line installed here is measured in the same run (issue 23): the mitmdump
of this interpreter's environment and of every other environment given with ``--line`` (default:
``.venv*`` / ``.ci-venv*`` environments in this checkout whose mitmproxy version differs), e.g.
mitmproxy 11.0.2 on Python 3.11 and 12.x on 3.12. The client and the upstream (this interpreter) are
the same for all; the lines are measured one after the other in the same run, and a table at the end
puts their END_STREAM, turn and ping-pong figures side by side.

Real processes on loopback: an HTTP/2 TLS upstream (this script with ``--upstream``, built on
``workbench.transport``), mitmdump, and an HTTP/2 client (``workbench.client.net``) in this
process tunnelling through the proxy with CONNECT.

1. Latency: a bidi Run ping-pong (client frame → server answers at once) measured through plain
   mitmdump with streaming turned on by a trivial addon (the fair baseline: the same stream
   callables, no recording) and through mitmdump with the capture addon. Passes alternate so load
   from other processes hits both alike. Prints median/p90 round trips and the ratio (goal ≤ 1.1×).
2. Flood: the upstream sends N frames as fast as it can on one Run; prints how fast the client got
   them through each proxy (``--flood-runs`` runs, alternating; the goal is on the median ratio
   capture/baseline, ``forwarding`` in goals.py) and how fast the addon got them committed to the
   database (``recorded``), the latter timed from the first frame leaving the upstream until the
   live reader sees the last one.
3. End of stream (issue 10): the upstream stamps its last frame with the time and ends the
   response at once (end-stream envelope + HTTP/2 END_STREAM); the client measures from that stamp
   to its end-of-stream event, directly and through each proxy. Two clients: one that never
   half-closes its request (as Node's http2 clients) and one that half-closes right after
   run_request. Plain streaming mitmdump holds the end for the first kind: reported as "held" when
   END_STREAM has not arrived after 2 s. Goal: median ≤ 5 ms added by the capture.
4. A full turn of a client that never half-closes (two KV round trips, 40 text deltas paced 10 ms
   apart, turn_ended, end-stream), on a warm connection: median wall time through the capture vs
   direct (goal ≤ 1.1×); plain mitmdump never completes it.

The override's dependencies on mitmproxy internals are listed in
``workbench.capture.stream_end.DEPENDS_ON``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "benchmarks"))  # goals.py, also when this file is imported

from goals import goal  # noqa: E402

RUN_PATH = "/agent.v1.AgentService/Run"
BASELINE_ADDON = '''
def _same(chunk):
    return chunk

def requestheaders(flow):
    flow.request.stream = _same

def responseheaders(flow):
    flow.response.stream = _same
'''


# upstream ------------------------------------------------------------------------------------------

async def _upstream() -> None:
    from workbench.schema import pb
    from workbench.transport import serve

    def text(t: str) -> bytes:
        return bytes(pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(
            text_delta=pb.TextDelta(text=t))).SerializeToString())

    async def handler(conn) -> None:  # type: ignore[no-untyped-def]
        first = await conn.receive()
        if first is None:
            return
        msg = pb.AgentClientMessage.FromString(first)
        prompt = msg.run_request.action.user_message_action.user_message.text
        if prompt.startswith("flood:"):
            n = int(prompt.split(":", 1)[1])
            body = "x" * 80
            from workbench.wire.envelope import encode

            await conn.send(text(f"start {time.time_ns() // 1000}"))
            # Many envelopes per write, as a busy server's DATA frames carry them: this measures
            # the recorder, not the per-DATA-frame cost of the proxy.
            for i in range(0, n, 50):
                await conn._ex.write(b"".join(encode(text(f"{j} {body}")) for j in range(i, min(n, i + 50))))
            await conn.end()
            return
        if prompt == "endstamp":
            # The last frame carries the time; the end-stream and END_STREAM follow immediately.
            await conn.send(text(str(time.time_ns() // 1000)))
            await conn.end()
            return
        if prompt == "turn":
            for kid in (1, 2):
                await conn.send(bytes(pb.AgentServerMessage(kv_server_message=pb.KvServerMessage(
                    id=kid, set_blob_args=pb.SetBlobArgs(blob_id=bytes(32), blob_data=b'{"role":"system"}')))
                    .SerializeToString()))
                while True:
                    m = await conn.receive()
                    if m is None or pb.AgentClientMessage.FromString(m).WhichOneof("message") == "kv_client_message":
                        break
            for j in range(40):  # a fast model's pace: a text delta every 10 ms
                await conn.send(text(f"delta {j} "))
                await asyncio.sleep(0.01)
            await conn.send(bytes(pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(
                turn_ended=pb.TurnEnded())).SerializeToString()))
            await conn.end()
            return
        if prompt == "stamp":
            # The first server frame carries the time it was sent (µs since the epoch).
            await conn.send(text(str(time.time_ns() // 1000)))
            while await conn.receive() is not None:
                pass
            await conn.end()
            return
        pong = text("pong")
        while True:
            m = await conn.receive()
            if m is None:
                break
            await conn.send(pong)
        await conn.end()

    server = await serve(handler, port=0, tls=True, cert_dir=os.environ.get("BENCH_CERT_DIR"))
    print(server.url, flush=True)
    print(f"cert: {server.cert_path}", flush=True)
    await asyncio.Event().wait()


# helpers ---------------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"mitmdump exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit("mitmdump did not start")


def _mitmdump(script: str, confdir: Path, extra: list[str], exe: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    cmd = [str(exe), "-q", "-s", script, "--listen-host", "127.0.0.1", "--listen-port", str(port),
           "--set", f"confdir={confdir}", "--set", "ssl_insecure=true", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _wait_port(port, proc)
    return proc, port


PROBE = ("import sys, mitmproxy.version, workbench.capture.addon; "
         "print(mitmproxy.version.VERSION, '%d.%d' % sys.version_info[:2])")


def _probe(python: Path) -> tuple[str, str] | None:
    """(mitmproxy version, Python version) of an environment that can run the capture addon."""
    try:
        out = subprocess.run([str(python), "-c", PROBE], capture_output=True, text=True, timeout=120, cwd=ROOT)
    except (OSError, subprocess.TimeoutExpired):
        return None
    parts = out.stdout.split()
    return (parts[0], parts[1]) if out.returncode == 0 and len(parts) == 2 else None


def _find_lines(given: list[str]) -> list[tuple[str, Path]]:
    """(label, mitmdump) for this environment and each other mitmproxy line installed here."""
    own = Path(sys.executable)
    candidates = [own, *(Path(p) for p in given)]
    if not given:
        candidates += sorted(ROOT.glob(".venv*/bin/python")) + sorted(ROOT.glob(".ci-venv*/bin/python"))
    lines: dict[str, tuple[str, Path]] = {}
    for py in candidates:
        found = _probe(py)
        if found is None:
            if py in (own, *(Path(p) for p in given)):
                print(f"--line {py}: no mitmproxy with the workbench capture addon there; skipped", file=sys.stderr)
            continue
        mitm, pyver = found
        exe = py.with_name("mitmdump")
        if mitm not in lines and exe.exists():
            lines[mitm] = (f"mitmproxy {mitm} / py{pyver}", exe)
    return list(lines.values())


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(2)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def _open_run(url: str, proxy_port: int | None, ca: Path, prompt: str,  # type: ignore[no-untyped-def]
                    conn: Any = None):
    from workbench.client.net import H2Connection
    from workbench.schema import pb
    from workbench.wire.envelope import encode

    if conn is None:
        os.environ["HTTPS_PROXY"] = f"http://127.0.0.1:{proxy_port}" if proxy_port else ""
        os.environ["NO_PROXY"] = ""
        conn = H2Connection(url, verify=str(ca))
        await conn.connect()
    rid = str(uuid.uuid4())
    stream = await conn.request(RUN_PATH, [
        ("content-type", "application/connect+proto"), ("connect-protocol-version", "1"),
        ("authorization", "Bearer bench-token"), ("x-request-id", rid)])
    run = pb.AgentClientMessage(run_request=pb.AgentRunRequest(
        conversation_id="bench", action=pb.ConversationAction(user_message_action=pb.UserMessageAction(
            user_message=pb.UserMessage(text=prompt)))))
    await stream.send(encode(run.SerializeToString()))
    return conn, stream, rid


async def _pingpong(url: str, proxy_port: int, ca: Path, rounds: int) -> list[float]:
    from workbench.schema import pb
    from workbench.wire.envelope import EnvelopeParser, encode

    conn, stream, _ = await _open_run(url, proxy_port, ca, "pingpong")
    hb = encode(pb.AgentClientMessage(client_heartbeat=pb.ClientHeartbeat()).SerializeToString())
    parser = EnvelopeParser()
    chunks = stream.chunks()
    rtts: list[float] = []
    for i in range(rounds + 10):
        t0 = time.perf_counter()
        await stream.send(hb)
        got: list[Any] = []
        while not got:
            got = parser.feed(await chunks.__anext__())
        if i >= 10:  # warm-up rounds
            rtts.append((time.perf_counter() - t0) * 1e6)
    await stream.end()
    await conn.close()
    return rtts


async def _first_frame(url: str, proxy_port: int, ca: Path, runs: int) -> list[float]:
    """Milliseconds from the server sending its first frame to the client having it."""
    from workbench.schema import pb
    from workbench.wire.envelope import EnvelopeParser

    out: list[float] = []
    for _ in range(runs):
        conn, stream, _ = await _open_run(url, proxy_port, ca, "stamp")
        parser = EnvelopeParser()
        async for chunk in stream.chunks():
            envs = parser.feed(chunk)
            if envs:
                now = time.time_ns() // 1000
                sent = int(pb.AgentServerMessage.FromString(envs[0].payload).interaction_update.text_delta.text)
                out.append((now - sent) / 1000)
                break
        await stream.end()
        await conn.close()
    return out


async def _flood(url: str, proxy_port: int, ca: Path, n: int, db: Path | None) -> tuple[float, float | None]:
    from workbench.store import open_reader
    from workbench.wire.envelope import EnvelopeParser

    conn, stream, rid = await _open_run(url, proxy_port, ca, f"flood:{n}")
    await stream.end()
    parser = EnvelopeParser()
    got = 0
    t_first = None
    async for chunk in stream.chunks():
        if t_first is None:
            t_first = time.perf_counter()
        got += len(parser.feed(chunk))
    t_client = time.perf_counter()
    await conn.close()
    assert t_first is not None
    client_rate = got / (t_client - t_first)
    if db is None:
        return client_rate, None
    want = n + 3  # run_request + start + n texts + end_stream
    reader = open_reader(db)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        count = reader.query("SELECT count(*) FROM frames WHERE session_id = ?", [rid]).column(0)[0].as_py()
        if count >= want:
            break
        await asyncio.sleep(0.02)
    t_db = time.perf_counter()
    return client_rate, n / (t_db - t_first)


async def _read_to_end(stream: Any) -> int:
    """Read a stream to its END_STREAM; the µs stamp its first text frame carried."""
    from workbench.schema import pb
    from workbench.wire.envelope import EnvelopeParser

    parser = EnvelopeParser()
    stamp = 0
    async for chunk in stream.chunks():
        for env in parser.feed(chunk):
            if not env.flags and not stamp:
                stamp = int(pb.AgentServerMessage.FromString(env.payload).interaction_update.text_delta.text)
    return stamp


async def _play_turn(stream: Any) -> None:
    """Answer the turn's KV requests; return at the response's END_STREAM (the request stays open)."""
    from workbench.schema import pb
    from workbench.wire.envelope import EnvelopeParser, encode

    parser = EnvelopeParser()
    async for chunk in stream.chunks():
        for env in parser.feed(chunk):
            if env.flags:
                continue
            msg = pb.AgentServerMessage.FromString(env.payload)
            if msg.WhichOneof("message") == "kv_server_message":
                await stream.send(encode(pb.AgentClientMessage(kv_client_message=pb.KvClientMessage(
                    id=msg.kv_server_message.id, set_blob_result=pb.SetBlobResult())).SerializeToString()))


async def _end_latency(url: str, proxy_port: int | None, ca: Path, runs: int, half_close: bool,
                       hold: float = 2.0) -> list[float | None]:
    """Milliseconds from the server's last frame (END_STREAM right behind it) to the client's end
    of stream; None when the end did not arrive within ``hold`` seconds (held by the proxy)."""
    out: list[float | None] = []
    for _ in range(runs):
        conn, stream, _ = await _open_run(url, proxy_port, ca, "endstamp")
        if half_close:
            await stream.end()
        try:
            stamp = await asyncio.wait_for(_read_to_end(stream), hold)
            out.append((time.time_ns() // 1000 - stamp) / 1000)
        except TimeoutError:
            out.append(None)
        await stream.end()
        await conn.close()
    return out


async def _turns(url: str, proxy_port: int | None, ca: Path, turns: int, hold: float = 10.0) -> list[float | None]:
    """Seconds per turn of a client that never half-closes, on one warm connection."""
    from workbench.client.net import H2Connection

    os.environ["HTTPS_PROXY"] = f"http://127.0.0.1:{proxy_port}" if proxy_port else ""
    conn = H2Connection(url, verify=str(ca))
    await conn.connect()
    out: list[float | None] = []
    for _ in range(turns):
        t0 = time.perf_counter()
        _, stream, _ = await _open_run(url, proxy_port, ca, "turn", conn=conn)
        try:
            await asyncio.wait_for(_play_turn(stream), hold)
            out.append(time.perf_counter() - t0)
        except TimeoutError:
            out.append(None)
            break  # a proxy that holds the end holds every turn
        finally:
            await stream.end()  # only now, once the response has ended
    await conn.close()
    return out


def _fmt_ms(xs: list[float | None]) -> str:
    got = sorted(x for x in xs if x is not None)
    if not got:
        return f"held ({len(xs)}/{len(xs)} runs: no END_STREAM within the wait)"
    held = len(xs) - len(got)
    return (f"median {statistics.median(got):6.2f} ms   p90 {got[int(len(got) * 0.9)]:6.2f} ms"
            + (f"   ({held} held)" if held else ""))


def _writer_only(n: int, tmp: Path) -> float:
    """Frames/s through the recording path alone (queue → decode → redact → commit), no proxy."""
    from workbench.capture.writer import (
        CaptureWriter,
        Chunk,
        Done,
        Eof,
        FlowOpen,
        Open,
        WriterConfig,
    )
    from workbench.schema import pb
    from workbench.wire.envelope import encode

    body = b"".join(encode(pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(
        text_delta=pb.TextDelta(text=f"{i} " + "x" * 80))).SerializeToString()) for i in range(n))
    chunks = [body[i:i + 16384] for i in range(0, len(body), 16384)]
    w = CaptureWriter(WriterConfig(db_path=str(tmp / "writer-only.duckdb"), live=False))
    w.start()
    put = w.queue.put
    t0 = time.perf_counter()
    put(Open(FlowOpen(key="k", transport="run", streaming=True, host="h", path=RUN_PATH,
                           ts_us=time.time_ns() // 1000, request_id="writer-only")))
    for c in chunks:
        put(Chunk("k", "server", time.time_ns() // 1000, c))
    put(Eof("k", "server", time.time_ns() // 1000))
    put(Done("k", time.time_ns() // 1000, None, {}))
    w.stop()
    dt = time.perf_counter() - t0
    assert w.frames_committed == n, (w.frames_committed, n)
    return n / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=300, help="ping-pong round trips per pass")
    ap.add_argument("--passes", type=int, default=3, help="alternating passes per configuration")
    ap.add_argument("--flood", type=int, default=50_000, help="frames in the flood")
    ap.add_argument("--flood-runs", type=int, default=5, help="floods per proxy (alternating)")
    ap.add_argument("--end-runs", type=int, default=30, help="runs per end-of-stream measurement")
    ap.add_argument("--turns", type=int, default=20, help="turns per full-turn measurement")
    ap.add_argument("--line", action="append", default=[], metavar="PYTHON",
                    help="also measure the mitmproxy of this environment's Python (repeatable)")
    args = ap.parse_args()
    if args.upstream:
        asyncio.run(_upstream())
        return

    lines = _find_lines(args.line)
    tmp = Path(tempfile.mkdtemp(prefix="bench-capture-"))
    env = dict(os.environ, BENCH_CERT_DIR=str(tmp / "certs"))
    up = subprocess.Popen([sys.executable, __file__, "--upstream"], stdout=subprocess.PIPE, text=True, env=env)
    assert up.stdout is not None
    url = up.stdout.readline().strip()
    up_cert = Path(up.stdout.readline().strip().split("cert: ", 1)[1])
    baseline_script = tmp / "baseline_stream.py"
    baseline_script.write_text(BASELINE_ADDON)
    confdir = tmp / "mitm"
    entry = str(ROOT / "addons" / "cursor_capture.py")
    print("lines: " + ", ".join(label for label, _ in lines))
    procs: dict[str, dict[str, tuple[subprocess.Popen[bytes], int]]] = {}
    try:
        for n, (label, exe) in enumerate(lines):
            db = tmp / f"bench-{n}.duckdb"
            procs[label] = {"baseline": _mitmdump(str(baseline_script), confdir, [], exe),
                            "capture": _mitmdump(entry, confdir, ["--set", f"cursor_db={db}"], exe)}
        ca = confdir / "mitmproxy-ca-cert.pem"
        table = {label: _measure_line(label, procs[label], url, up_cert, ca, args, tmp / f"bench-{n}.duckdb")
                 for n, (label, _) in enumerate(lines)}
        _print_table(table)
    finally:
        for pair in procs.values():
            for proc, _ in pair.values():
                _stop(proc)
        up.terminate()
        up.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def _measure_line(label: str, procs: dict[str, tuple[subprocess.Popen[bytes], int]], url: str, up_cert: Path,
                  ca: Path, args: argparse.Namespace, db: Path) -> dict[str, str]:
    """One line's figures (printed as they come); returns the ones the side-by-side table shows."""
    row: dict[str, str] = {}
    print(f"== {label}")
    rtts: dict[str, list[float]] = {name: [] for name in procs}
    for _ in range(args.passes):
        for name, (_, port) in procs.items():
            rtts[name] += asyncio.run(_pingpong(url, port, ca, args.rounds))
    print(f"ping-pong over one bidi Run, {args.passes} x {args.rounds} round trips per proxy")
    med = {}
    for name, xs in rtts.items():
        xs.sort()
        med[name] = statistics.median(xs)
        print(f"  {name:<9} median {med[name]:8.0f} µs   p90 {xs[int(len(xs) * 0.9)]:8.0f} µs")
    ratio = med["capture"] / med["baseline"]
    print(f"  ratio capture/baseline (median round trip): {ratio:.3f}x (goal ≤ 1.1x)")
    print(f"  added per round trip: {med['capture'] - med['baseline']:.0f} µs (two frames: one each way)")
    row["ping-pong median, baseline / capture"] = f"{med['baseline']:.0f} / {med['capture']:.0f} µs"
    row["ping-pong ratio capture/baseline"] = f"{ratio:.3f}x"

    print("first server frame, sent → received by the client (new Run each time, 20 runs)")
    for name, (_, port) in procs.items():
        ms = sorted(asyncio.run(_first_frame(url, port, ca, 20)))
        print(f"  {name:<9} median {statistics.median(ms):6.1f} ms   max {ms[-1]:6.1f} ms (goal < 50 ms)")

    runs = args.end_runs
    print(f"end of stream: server's last frame + END_STREAM → client's end of stream, {runs} runs each")
    ends: dict[tuple[str, bool], list[float | None]] = {}
    for half in (False, True):
        print(f"  {'client half-closes after run_request' if half else 'client never half-closes'}:")
        for name, port, cafile in (("direct", None, up_cert), ("baseline", procs["baseline"][1], ca),
                                   ("capture", procs["capture"][1], ca)):
            ends[(name, half)] = asyncio.run(_end_latency(url, port, cafile, runs, half))
            print(f"    {name:<9} {_fmt_ms(ends[(name, half)])}")
    for half, other in ((False, "direct"), (True, "baseline")):
        cap = [x for x in ends[("capture", half)] if x is not None]
        ref = [x for x in ends[(other, half)] if x is not None]
        kind = "half-closing" if half else "never half-closing"
        if cap and ref:
            added = statistics.median(cap) - statistics.median(ref)
            print(f"  added by capture vs {other} ({kind} client): {added:+.2f} ms median (goal ≤ 5 ms)")
            row[f"END_STREAM added vs {other}, {kind}"] = f"{added:+.2f} ms"
    row["END_STREAM never half-closing: capture"] = _fmt_ms(ends[("capture", False)]).split("   p90")[0]
    row["END_STREAM never half-closing: plain mitmdump"] = _fmt_ms(ends[("baseline", False)]).split(" (")[0]

    print(f"full turn of a client that never half-closes, {args.turns} turns on one warm connection")
    turn_s: dict[str, list[float | None]] = {}
    for name, port, cafile in (("direct", None, up_cert), ("capture", procs["capture"][1], ca),
                               ("baseline", procs["baseline"][1], ca)):
        turn_s[name] = asyncio.run(_turns(url, port, cafile, args.turns if name != "baseline" else 1))
        print(f"  {name:<9} {_fmt_ms([x * 1000 if x is not None else None for x in turn_s[name]])}")
    d = statistics.median([x for x in turn_s["direct"] if x is not None])
    c_turns = [x for x in turn_s["capture"] if x is not None]
    if c_turns:
        c = statistics.median(c_turns)
        print(f"  ratio capture/direct (median turn): {c / d:.3f}x (goal ≤ 1.1x)")
        row["turn median, direct / capture"] = f"{d * 1000:.1f} / {c * 1000:.1f} ms"
        row["turn ratio capture/direct"] = f"{c / d:.3f}x"
    row["turns completed through capture"] = f"{len(c_turns)}/{len(turn_s['capture'])}"

    print(f"flood: {args.flood:,} server frames on one Run, {args.flood_runs} runs, baseline and capture alternating")
    ratios, db_rates = [], []
    for _ in range(args.flood_runs):
        base_rate, _ = asyncio.run(_flood(url, procs["baseline"][1], ca, args.flood, None))
        cap_rate, db_rate = asyncio.run(_flood(url, procs["capture"][1], ca, args.flood, db))
        ratios.append(cap_rate / base_rate)
        db_rates.append(db_rate or 0.0)
        print(f"  client receive rate  baseline {base_rate:10,.0f} frames/s   capture {cap_rate:10,.0f} frames/s"
              f"   capture/baseline {cap_rate / base_rate:.2f}x")
    ratios.sort()
    fwd = statistics.median(ratios)
    print(f"  capture/baseline min {ratios[0]:.2f}x median {fwd:.2f}x max {ratios[-1]:.2f}x")
    print("  " + goal("forwarding").line(fwd))
    db_rate = statistics.median(db_rates)
    print("  " + goal("recorded").line(db_rate))
    print(f"  recording path alone (no proxy, same process): {_writer_only(args.flood, db.parent):,.0f} frames/s")
    row["flood recorded"] = f"{db_rate:,.0f} frames/s"
    row["flood forwarding capture/baseline (median)"] = f"{fwd:.2f}x"
    return row


def _print_table(table: dict[str, dict[str, str]]) -> None:
    """The lines side by side (same run, same machine)."""
    labels = list(table)
    keys = list(dict.fromkeys(k for row in table.values() for k in row))
    width = max(len(k) for k in keys) + 2
    cols = [max(len(label), *(len(table[label].get(k, "-")) for k in keys)) + 2 for label in labels]
    print("\nside by side (same run, same machine):")
    print(" " * width + "".join(label.ljust(w) for label, w in zip(labels, cols, strict=True)))
    for k in keys:
        print(k.ljust(width) + "".join(table[label].get(k, "-").ljust(w) for label, w in zip(labels, cols, strict=True)))


if __name__ == "__main__":
    main()
