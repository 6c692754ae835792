"""Simulator throughput: frames/s a client receives from ``workbench sim`` on one h2 Run.

    python benchmarks/sim.py [--frames 40000] [--passes 3]

Both sides are real: the simulated backend on loopback (TLS, HTTP/2) and the workbench client's
HTTP/2 connection (``workbench.client.net``) in this process.

- baseline: a bare handler on the same transport (``workbench.transport.serve``) sending
  pre-serialized heartbeat envelopes as fast as it can — the transport's ceiling;
- sim: the scenario engine streaming a text turn of the same number of frames (text_delta +
  token_delta pairs built, serialized and recorded one by one), then turn_ended.

Passes alternate so load from other processes hits both alike. Prints the medians and the ratio
sim/baseline (how much of the transport's throughput the engine keeps).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from workbench.client.net import H2Connection  # noqa: E402
from workbench.schema import pb  # noqa: E402
from workbench.sim.runner import start_sim  # noqa: E402
from workbench.transport import AgentConnection, serve  # noqa: E402
from workbench.wire.envelope import EnvelopeParser, encode  # noqa: E402

RUN = "/agent.v1.AgentService/Run"
HEARTBEAT = bytes.fromhex("0a026a00")


def run_request() -> bytes:
    req = pb.AgentRunRequest(
        conversation_state=pb.ConversationStateStructure(), conversation_id=str(uuid.uuid4()),
        requested_model=pb.RequestedModel(model_id="default"),
        action=pb.ConversationAction(user_message_action=pb.UserMessageAction(
            user_message=pb.UserMessage(text="[scenario:bench_stream] go"))))
    return bytes(pb.AgentClientMessage(run_request=req).SerializeToString())


async def receive_all(url: str, cert: Path) -> tuple[int, float]:
    """Open one Run, send the run_request, count envelopes until the end-stream."""
    conn = H2Connection(url, verify=str(cert))
    await conn.connect()
    try:
        start = time.perf_counter()
        stream = await conn.request(RUN, [("content-type", "application/connect+proto"),
                                          ("authorization", "Bearer bench")])
        await stream.send(encode(run_request()))
        parser = EnvelopeParser()
        frames = 0
        async for chunk in stream.chunks():
            for env in parser.feed(chunk):
                frames += 1
                if env.is_end_stream:
                    return frames, time.perf_counter() - start
        return frames, time.perf_counter() - start
    finally:
        await conn.close()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=40000, help="frames per turn (default 40000)")
    ap.add_argument("--passes", type=int, default=3)
    args = ap.parse_args()
    pairs = args.frames // 2

    with tempfile.TemporaryDirectory() as tmp:
        scen = Path(tmp) / "scenarios"
        scen.mkdir()
        (scen / "bench_stream.json").write_text(json.dumps({
            "description": "many small text deltas",
            "steps": [{"text": "w" * pairs, "chunks": pairs}, {"turn_ended": True}, {"end": "ok"}]}))
        sim = await start_sim(scenario_dirs=[scen], cert_dir=Path(tmp) / "cert")

        async def flood(conn: AgentConnection) -> None:
            await conn.receive()
            for _ in range(2 * pairs + 1):
                await conn.send(HEARTBEAT)
            await conn.end()

        raw = await serve(flood, cert_dir=Path(tmp) / "cert")
        assert sim.cert_path is not None and raw.cert_path is not None
        base_rates: list[float] = []
        sim_rates: list[float] = []
        try:
            await receive_all(sim.url, sim.cert_path)  # warm-up (imports, TLS session)
            for _ in range(args.passes):
                n, dt = await receive_all(raw.url, raw.cert_path)
                base_rates.append(n / dt)
                n2, dt2 = await receive_all(sim.url, sim.cert_path)
                if n2 != n:
                    raise SystemExit(f"frame counts differ: baseline {n}, sim {n2}")
                sim_rates.append(n2 / dt2)
        finally:
            await sim.close()
            await raw.close()
    base = statistics.median(base_rates)
    simr = statistics.median(sim_rates)
    print(f"frames per turn: {2 * pairs + 2}")
    print(f"baseline (bare transport, pre-serialized frames): {base:,.0f} frames/s")
    print(f"sim (scenario engine, text turn):                 {simr:,.0f} frames/s")
    print(f"ratio sim/baseline: {simr / base:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
