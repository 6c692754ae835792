"""Fixture export, content scrubbing, Parquet export and replay throughput.

    python benchmarks/fixtures.py [--frames 20000] [--replay-frames 20000]

Each figure comes with a baseline measured in the same run on the same data:

- export (secrets scrubbed) and export with --scrub-content, against the unavoidable work: reading
  the same rows and writing them as base64 JSON without any scrubbing;
- Parquet export (partitioned by date and session, all tables), against one unpartitioned
  ``COPY frames TO … (FORMAT PARQUET)``;
- replay of a text-heavy recording to the built-in client, against a bare handler on the same
  transport that sends the same payloads without matching anything.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from workbench.decode.classify import CLIENT_MSG, SERVER_MSG, default_decoder  # noqa: E402
from workbench.schema import pb  # noqa: E402
from workbench.store.db import SessionInfo, Store, now_us  # noqa: E402
from workbench.store.recorder import Recorder  # noqa: E402


def _server(**kw: object) -> bytes:
    return bytes(pb.AgentServerMessage(**kw).SerializeToString())


def build_session(store: Store, sid: str, n: int, text_only: bool = False) -> None:
    dec = default_decoder()
    rec = Recorder(store)
    rec.open_session(SessionInfo(sid, source="bench", transport="run", status="complete"))
    t = now_us()
    req = pb.AgentClientMessage(run_request=pb.AgentRunRequest(conversation_id="c", conversation_state={}))
    req.run_request.action.user_message_action.user_message.text = "please refactor the module " * 20
    items: list[tuple[str, bytes]] = [("client", bytes(req.SerializeToString()))]
    system = json.dumps({"role": "system", "content": "You are a coding agent. " * 400}).encode()
    if not text_only:
        items.append(("server", _server(kv_server_message=pb.KvServerMessage(
            id=1, set_blob_args=pb.SetBlobArgs(blob_id=hashlib.sha256(system).digest(), blob_data=system)))))
    args = json.dumps({"path": "src/module.py", "content": "def f(x):\n    return x * 2\n" * 40})
    i = 0
    while len(items) < n:
        i += 1
        if text_only or i % 10:
            items.append(("server", _server(interaction_update=pb.InteractionUpdate(
                text_delta=pb.TextDelta(text=f"word{i} and some more text ")))))
        elif i % 20 == 0:
            cut = min(len(args), 40 + (i * 7) % len(args))
            items.append(("server", _server(interaction_update=pb.InteractionUpdate(
                partial_tool_call=pb.PartialToolCall(call_id=f"call_{i // 400}", args_text_delta=args[:cut])))))
        else:
            items.append(("server", _server(interaction_update=pb.InteractionUpdate(heartbeat=pb.Heartbeat()))))
    items.append(("server", _server(interaction_update=pb.InteractionUpdate(turn_ended=pb.TurnEnded()))))
    for direction, payload in items:
        t += 100
        rec.add(sid, t, direction, "run", "1", dec.classify_agent(payload, CLIENT_MSG if direction == "client"
                                                                  else SERVER_MSG))
    rec.flush()


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def bench_export(db: Path, n: int, out: Path) -> None:
    from workbench.fixtures.export import export_session
    from workbench.fixtures.format import dump
    from workbench.store.reader import open_reader

    reader = open_reader(db)

    def baseline() -> None:
        rows = reader.query("SELECT * EXCLUDE (decoded, summary) FROM frames WHERE session_id = 's'").to_pylist()
        doc = [{k: (base64.b64encode(v).decode() if isinstance(v, bytes) else str(v)) for k, v in r.items()}
               for r in rows]
        (out / "baseline.json").write_text(json.dumps(doc, indent=1))

    base = timed(baseline)
    plain = timed(lambda: dump(export_session(reader, "s", reanalyze=False), out / "plain.json"))
    content = timed(lambda: dump(export_session(reader, "s", scrub_content=True, scrub_key=b"k" * 32,
                                                reanalyze=False), out / "content.json"))
    reader.close()
    print(f"baseline (read + base64 JSON)   {n / base:10,.0f} frames/s")
    print(f"export-fixture                  {n / plain:10,.0f} frames/s   {plain / base:5.2f}x baseline time")
    print(f"export-fixture --scrub-content  {n / content:10,.0f} frames/s   {content / base:5.2f}x baseline time")


def bench_parquet(db: Path, n: int, out: Path) -> None:
    import duckdb

    from workbench.export.parquet import export_parquet

    con = duckdb.connect(str(db), read_only=True)
    base = timed(lambda: con.execute(f"COPY frames TO '{out / 'flat.parquet'}' (FORMAT PARQUET)"))
    con.close()
    part = timed(lambda: export_parquet(db, out / "pq"))
    print(f"COPY frames (unpartitioned)     {n / base:10,.0f} frames/s")
    print(f"export --parquet (all tables)   {n / part:10,.0f} frames/s   {part / base:5.2f}x baseline time")


async def bench_replay(db: Path, n: int) -> None:
    from workbench.client.agent import AgentClient
    from workbench.fixtures.export import export_session
    from workbench.fixtures.replay_server import ReplayServer
    from workbench.store.reader import open_reader
    from workbench.transport import serve

    reader = open_reader(db)
    fx = export_session(reader, "r", reanalyze=False)
    reader.close()
    payloads = [f.payload for f in fx.frames if f.direction == "server"]

    async def bare(conn) -> None:  # type: ignore[no-untyped-def]
        await conn.receive()
        for p in payloads:
            await conn.send(p)
        await conn.end()

    async def run_client(url: str, cert: Path | None) -> float:
        async with AgentClient(url, "bench", verify=str(cert) if cert else None) as c:
            t = time.perf_counter()
            res = await c.run_turn("go", raise_on_error=False)
            assert res.ended, res.error
            return time.perf_counter() - t

    server = await serve(bare)
    try:
        base = await run_client(server.url, server.cert_path)
    finally:
        await server.close()
    replay = ReplayServer(fx, settle=0).start()
    try:
        took = await run_client(replay.url, replay.cert_path)
        await asyncio.to_thread(replay.verify)
    finally:
        replay.close()
    print(f"bare handler → client           {n / base:10,.0f} frames/s")
    print(f"replay → client                 {n / took:10,.0f} frames/s   {took / base:5.2f}x baseline time")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=20000)
    ap.add_argument("--replay-frames", type=int, default=20000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        db = out / "bench.duckdb"
        with Store(db) as store:
            build_session(store, "s", args.frames)
            build_session(store, "r", args.replay_frames, text_only=True)
        bench_export(db, args.frames, out)
        bench_parquet(db, args.frames + args.replay_frames, out)
        asyncio.run(bench_replay(db, args.replay_frames))


if __name__ == "__main__":
    main()
