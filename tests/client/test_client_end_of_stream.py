"""After turn_ended the client reads on until the server ends the response, as real clients do,
and says so when that end never comes (a proxy holding back END_STREAM hides from a client that
gives up one second after turn_ended). Against a test-only h2 server that holds the end back, and
against the real ``workbench sim`` for the healthy case."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from client_sim_process import WORKBENCH, recorded_frames, start_sim
from held_end_server import HeldEndServer

from workbench.client.agent import AgentClient
from workbench.client.events import StreamEndMissing, TextDelta, TurnEnded

pytestmark = pytest.mark.slow  # starts subprocesses or servers


@pytest.fixture
async def held(tmp_path: Path) -> AsyncIterator[HeldEndServer]:
    server = await HeldEndServer(tmp_path / "cert", mode="held").start()
    yield server
    await server.close()


def client(server: HeldEndServer, **kw: object) -> AgentClient:
    return AgentClient(server.url, "t", verify=server.cert_path, heartbeat_interval=0.05, **kw)  # type: ignore[arg-type]


async def test_a_held_back_end_is_reported_after_the_timeout(held: HeldEndServer) -> None:
    async with client(held, end_timeout=1.0) as c:
        events = [ev async for ev in c.stream_turn("hi")]
    kinds = [type(e).__name__ for e in events]
    assert kinds[-2:] == ["TurnEnded", "StreamEndMissing"]  # the turn is complete, then the report
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "held-end answer"
    missing = events[-1]
    assert isinstance(missing, StreamEndMissing)
    assert "end of stream never arrived" in missing.message
    assert "HTTP/2 END_STREAM flag did not" in missing.message  # the end-stream frame itself came through
    assert "proxy" in missing.message
    [log] = held.streams
    # like a real client it kept its request open (and heartbeating) while it waited
    assert log.client_frames_after_turn > 0
    assert log.client_ended or log.client_reset  # then it let go


async def test_run_turn_keeps_the_report_next_to_a_complete_turn(held: HeldEndServer) -> None:
    async with client(held, end_timeout=0.5) as c:
        res = await c.run_turn("hi")
    assert res.ended
    assert res.error is None
    assert res.text == "held-end answer"
    assert res.end_missing is not None
    assert "never arrived" in res.end_missing.message


async def test_no_end_stream_frame_at_all_is_reported_too(tmp_path: Path) -> None:
    server = await HeldEndServer(tmp_path / "cert", mode="silent").start()
    try:
        async with client(server, end_timeout=0.5) as c:
            res = await c.run_turn("hi")
    finally:
        await server.close()
    assert res.ended
    assert res.end_missing is not None
    assert "neither its end-stream frame nor the end of the response came" in res.end_missing.message


async def test_the_old_behaviour_hides_the_held_end(held: HeldEndServer) -> None:
    # wait_for_end=False: close about a second after turn_ended; the proxy then lets the end through
    async with client(held, wait_for_end=False) as c:
        res = await c.run_turn("hi")
    assert res.ended
    assert res.error is None
    assert res.end_missing is None
    [log] = held.streams
    assert log.client_ended
    assert log.released


async def test_a_prompt_end_is_not_reported(tmp_path: Path) -> None:
    server = await HeldEndServer(tmp_path / "cert", mode="prompt").start()
    try:
        async with client(server, end_timeout=30.0) as c:
            res = await c.run_turn("hi")
    finally:
        await server.close()
    assert res.ended
    assert res.error is None
    assert res.end_missing is None


async def test_leaving_at_turn_ended_does_not_wait_for_the_end(held: HeldEndServer) -> None:
    """The proxy's way: it has its answer at turn_ended and stops reading; closing the run then
    must not take the end timeout (the OpenAI answer is complete at turn_ended)."""
    async with client(held, end_timeout=600.0) as c:
        events = c.stream_turn("hi")
        async for ev in events:
            if isinstance(ev, TurnEnded):
                break
        await asyncio.wait_for(events.aclose(), 30)  # a bounded settle, not the 600 s end timeout
    [log] = held.streams
    assert log.client_ended or log.client_reset


@pytest.mark.parametrize("transport", ["run", "runsse", "runpoll"])
async def test_a_healthy_turn_against_the_real_sim_reports_nothing(tmp_path: Path, transport: str) -> None:
    sim = await asyncio.to_thread(start_sim, tmp_path)
    try:
        db = tmp_path / "rec.duckdb"
        async with AgentClient(sim.url, "t", transport=transport, verify=sim.cert, record_to=db,
                               end_timeout=30.0) as c:
            res = await c.run_turn("[scenario:text] hello")
        summary = await asyncio.to_thread(sim.next_run)
    finally:
        sim.stop()
    assert res.ended
    assert res.error is None
    assert res.end_missing is None
    assert "-> turn_ended" in summary
    frames = recorded_frames(db, res.request_id)
    assert frames[-1]["kind"] == "end_stream"  # the wait saw the end: the recording ends with it


def test_the_cli_says_the_end_never_arrived(tmp_path: Path) -> None:
    async def serve_and_run() -> tuple[subprocess.CompletedProcess[str], HeldEndServer]:
        server = await HeldEndServer(tmp_path / "cert", mode="held").start()
        try:
            proc = await asyncio.to_thread(
                subprocess.run, [*WORKBENCH, "client", "--upstream", server.url, "--ca-file", server.cert_path,
                                 "--heartbeat-interval", "0.05", "--end-timeout", "1", "hello"],
                capture_output=True, text=True, timeout=120,
                env={**os.environ, "CURSOR_ACCESS_TOKEN": "sk-held-end-test"})
        finally:
            await server.close()
        return proc, server

    proc, _ = asyncio.run(serve_and_run())
    assert proc.stdout.strip() == "held-end answer"
    assert "end of stream never arrived" in proc.stderr
    assert "proxy" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.returncode == 1


def test_the_proxy_answers_at_turn_ended_without_waiting_for_the_end(tmp_path: Path) -> None:
    """openai SDK → real ``workbench proxy`` → a server holding END_STREAM: the OpenAI answer is
    complete at turn_ended, so neither a whole nor a streamed completion waits for the end (the SDK
    timeout, well under the client's 30 s end timeout, would trip if it did)."""
    import threading

    import openai

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = asyncio.run_coroutine_threadsafe(HeldEndServer(tmp_path / "cert", mode="held").start(), loop).result(60)
    proxy = subprocess.Popen([*WORKBENCH, "proxy", "--port", "0", "--upstream", server.url, "--ca-file",
                              server.cert_path, "--model", "default", "--quiet"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "CURSOR_ACCESS_TOKEN": "sk-held-end-proxy"})
    try:
        assert proxy.stdout is not None
        url = proxy.stdout.readline().strip()
        sdk = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=20)
        whole = sdk.chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}])
        assert whole.choices[0].message.content == "held-end answer"
        chunks = sdk.chat.completions.create(model="default", messages=[{"role": "user", "content": "again"}],
                                             stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "held-end answer"
    finally:
        proxy.terminate()
        proxy.wait(timeout=30)
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
    assert len(server.streams) == 2
