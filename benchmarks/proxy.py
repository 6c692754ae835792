"""What ``workbench proxy`` adds to time-to-first-token and per-chunk latency.

One run, same simulator, same machine:

- baseline: the client library (``AgentClient``, Run over HTTP/2, warm connection) → ``workbench sim``;
- proxied: the official ``openai`` SDK (streaming) → ``workbench proxy`` → ``workbench sim``.

Both sim and proxy are real subprocesses on loopback. The turn is a scenario with many streamed
text chunks, lightly paced (``--pace``) so the simulator does not dump the whole turn in one burst;
the per-chunk figure is then the pace plus each path's forwarding cost.
Prints medians/p90 for both paths, the added milliseconds and the ratio; the goal (``benchmarks/goals.py``,
proxy): the proxied path keeps ≥ 0.9× the direct speed, for TTFT and per chunk.

    python benchmarks/proxy.py [--turns 60] [--chunks 64] [--transport run]
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import openai
from goals import goal

from workbench.client.agent import AgentClient, Connections
from workbench.client.events import TextDelta, TurnEnded

WORKBENCH = [sys.executable, "-c", "import sys; from workbench.cli import main; sys.exit(main())"]
PROMPT = "[scenario:bench] measure me"


def start(args: list[str], env: dict[str, str] | None = None, lines: int = 1) -> tuple[subprocess.Popen[str], list[str]]:
    e = dict(os.environ)
    e.pop("HTTPS_PROXY", None)
    e.update(env or {})
    proc = subprocess.Popen([*WORKBENCH, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=e)
    assert proc.stdout is not None
    out = [proc.stdout.readline().strip() for _ in range(lines)]
    if not out[0]:
        raise SystemExit(f"{args[0]} did not start (rc={proc.poll()})")
    return proc, out


def stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def summarize(samples: list[float]) -> str:
    s = sorted(samples)
    p90 = s[min(len(s) - 1, int(len(s) * 0.9))]
    return f"median {statistics.median(s) * 1000:7.2f} ms   p90 {p90 * 1000:7.2f} ms"


class Direct:
    """The client library on its own event loop thread, so turns can alternate with the SDK's."""

    def __init__(self, url: str, cert: str, transport: str) -> None:
        self.url, self.cert, self.transport = url, cert, transport
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.conns = Connections(url, cert)

    def turn(self) -> tuple[float, float] | None:
        return asyncio.run_coroutine_threadsafe(self._turn(), self.loop).result(timeout=60)

    async def _turn(self) -> tuple[float, float] | None:
        client = AgentClient(self.url, "bench-token", transport=self.transport, verify=self.cert,
                             connections=self.conns)
        t0 = time.perf_counter()
        first = last = 0.0
        n = 0
        async for ev in client.stream_turn(PROMPT):
            if isinstance(ev, TextDelta):
                last = time.perf_counter()
                if n == 0:
                    first = last
                n += 1
            elif isinstance(ev, TurnEnded):
                break
        await client.aclose()
        return (first - t0, (last - first) / (n - 1)) if n > 1 else None

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.conns.aclose(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


def proxied_turn(client: openai.OpenAI) -> tuple[float, float] | None:
    t0 = time.perf_counter()
    first = last = 0.0
    n = 0
    for chunk in client.chat.completions.create(model="default", stream=True,
                                                messages=[{"role": "user", "content": PROMPT}]):
        if chunk.choices and chunk.choices[0].delta.content:
            last = time.perf_counter()
            if n == 0:
                first = last
            n += 1
    return (first - t0, (last - first) / (n - 1)) if n > 1 else None


def raw_turn(http: httpx.Client, url: str) -> tuple[float, float] | None:
    """The proxy without the SDK's own per-request cost: plain httpx, SSE lines split by hand."""
    body = json.dumps({"model": "default", "stream": True, "messages": [{"role": "user", "content": PROMPT}]})
    t0 = time.perf_counter()
    first = last = 0.0
    n = 0
    with http.stream("POST", url + "/v1/chat/completions", content=body,
                     headers={"content-type": "application/json"}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and '"content":"' in line and '"content":""' not in line:
                last = time.perf_counter()
                if n == 0:
                    first = last
                n += 1
    return (first - t0, (last - first) / (n - 1)) if n > 1 else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--chunks", type=int, default=64)
    ap.add_argument("--transport", default="run", choices=("run", "runsse", "runpoll"))
    ap.add_argument("--pace", type=float, default=0.002,
                    help="simulator seconds between deltas (0 = one burst; TTFT then includes the burst)")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="wb-bench-"))
    atexit.register(shutil.rmtree, tmp, True)  # after the sim and proxy are stopped
    text = " ".join(f"token{i:03d}" for i in range(a.chunks * 2))
    (tmp / "bench.json").write_text(json.dumps({"description": "benchmark: many text chunks", "steps": [
        {"text": text, "chunks": a.chunks}, {"turn_ended": True}, {"end": "ok"}]}))
    sim, lines = start(["sim", "--port", "0", "--scenario-dir", str(tmp), "--cert-dir", str(tmp / "certs"),
                        "--pace", str(a.pace), "--quiet"], lines=2)
    url, cert = lines[0], lines[1].split(":", 1)[1].strip()
    proxy, plines = start(["proxy", "--port", "0", "--upstream", url, "--ca-file", cert, "--transport", a.transport],
                          env={"CURSOR_ACCESS_TOKEN": "bench-token"})
    d_ttft: list[float] = []
    d_chunk: list[float] = []
    p_ttft: list[float] = []
    p_chunk: list[float] = []
    r_ttft: list[float] = []
    r_chunk: list[float] = []
    http = httpx.Client()
    direct = Direct(url, cert, a.transport)
    sdk = openai.OpenAI(base_url=plines[0] + "/v1", api_key="x", max_retries=0)
    try:
        # Alternate the paths turn by turn so load from other processes hits them alike;
        for i in range(a.warmup + a.turns):
            # rotate the order too: whichever goes first finds the other processes idle
            runs = {"d": direct.turn, "p": lambda: proxied_turn(sdk), "r": lambda: raw_turn(http, plines[0])}
            order = "dpr"[i % 3:] + "dpr"[:i % 3]
            got = {k: runs[k]() for k in order}
            d, p, r = got["d"], got["p"], got["r"]
            if i >= a.warmup and d and p and r:
                d_ttft.append(d[0])
                d_chunk.append(d[1])
                p_ttft.append(p[0])
                p_chunk.append(p[1])
                r_ttft.append(r[0])
                r_chunk.append(r[1])
    finally:
        http.close()
        sdk.close()
        direct.close()
        stop(proxy)
        stop(sim)
    print(f"workbench proxy overhead — {a.turns} turns x {a.chunks} text chunks, upstream transport "
          f"{a.transport}, sim pace {a.pace * 1000:g} ms")
    print(f"  TTFT   direct (client library)  {summarize(d_ttft)}")
    print(f"  TTFT   via proxy (openai SDK)   {summarize(p_ttft)}")
    print(f"  TTFT   via proxy (raw httpx)    {summarize(r_ttft)}")
    print(f"  chunk  direct                   {summarize(d_chunk)}")
    print(f"  chunk  via proxy                {summarize(p_chunk)}")
    added = (statistics.median(p_ttft) - statistics.median(d_ttft)) * 1000
    added_chunk = (statistics.median(p_chunk) - statistics.median(d_chunk)) * 1000
    print(f"  added TTFT      {added:+.2f} ms   (ratio proxy/direct {statistics.median(p_ttft) / statistics.median(d_ttft):.2f}x)")
    raw_added = (statistics.median(r_ttft) - statistics.median(d_ttft)) * 1000
    print(f"  added TTFT without the SDK's own cost (raw httpx client) {raw_added:+.2f} ms")
    print(f"  added per chunk {added_chunk:+.3f} ms (ratio {statistics.median(p_chunk) / max(statistics.median(d_chunk), 1e-9):.2f}x)")
    # speed = 1 / time: the direct time over the proxied one
    print("  TTFT   " + goal("proxy").line(statistics.median(d_ttft) / statistics.median(p_ttft)))
    print("  chunk  " + goal("proxy").line(statistics.median(d_chunk) / max(statistics.median(p_chunk), 1e-9)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
