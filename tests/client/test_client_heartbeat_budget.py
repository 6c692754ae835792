"""The heartbeat budget counts the server's waiting, not our own: heartbeats that arrive while one
of our answers is still being posted (a BidiAppend not yet answered) cannot mean the server is
stuck, since it has not seen the answer yet. Found by the healthy matrix: on a loaded machine a
set_blob_result append through mitmdump took 0.8 s while the simulator heartbeated every 0.05 s,
and a budget of 8 gave up on a healthy run."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx

from workbench.client.agent import AgentClient, ClientRun
from workbench.client.events import Error, Event
from workbench.client.recording import RunWire
from workbench.client.transport import Incoming, RunSSEChannel
from workbench.schema import pb

HEARTBEAT = pb.AgentClientMessage(client_heartbeat=pb.ClientHeartbeat()).SerializeToString()
RESULT = pb.AgentClientMessage(kv_client_message=pb.KvClientMessage(
    id=1, set_blob_result=pb.SetBlobResult())).SerializeToString()
SERVER_BEAT = pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(
    heartbeat=pb.Heartbeat())).SerializeToString()


async def test_an_answer_is_delivering_until_its_append_is_answered() -> None:
    release = asyncio.Event()
    posted: list[str] = []

    async def server(request: httpx.Request) -> httpx.Response:
        posted.append(request.url.path)
        await release.wait()
        return httpx.Response(200)

    async with httpx.AsyncClient(transport=httpx.MockTransport(server)) as http:
        ch = RunSSEChannel("https://sim.invalid", "t", RunWire([], None, "r"), http, request_id="r")
        await ch.send(HEARTBEAT)
        while len(posted) < 1:
            await asyncio.sleep(0)
        assert not ch.delivering()  # a heartbeat in flight is no answer the server waits for
        await ch.send(RESULT)
        while len(posted) < 2:
            await asyncio.sleep(0)
        assert ch.delivering()
        release.set()
        await asyncio.wait(list(ch._appends))
        assert not ch.delivering()
        await ch.close()


class _Posting:
    """A channel whose answer is still on its way for the first ``posting`` heartbeats."""

    transport = "runsse"
    request_id = "r"
    closed = False

    def __init__(self, posting: int) -> None:
        self.posting = posting

    def delivering(self) -> bool:
        return self.posting > 0

    async def send(self, msg: bytes) -> None:  # pragma: no cover - the client sends nothing here
        pass


async def _beats(ch: _Posting, n: int) -> AsyncIterator[Incoming]:
    for _ in range(n):
        yield Incoming("message", SERVER_BEAT)
        ch.posting -= 1
    yield Incoming("end")


async def _events(posting: int, beats: int, budget: int) -> list[Event]:
    client = AgentClient("https://sim.invalid", "t", transport="runsse", heartbeat_budget=budget)
    ch = _Posting(posting)
    run = ClientRun(ch, [], "default")  # type: ignore[arg-type]
    run.iterator = _beats(ch, beats)
    out: list[Any] = [ev async for ev in client._events(run)]
    await client.aclose()
    return out


async def test_heartbeats_while_an_answer_is_posting_do_not_count() -> None:
    # 10 heartbeats, the first 6 while our answer is posting: only 4 count, under a budget of 5
    events = await _events(posting=6, beats=10, budget=5)
    assert not [e for e in events if isinstance(e, Error) and e.code == "heartbeat_budget"]
    # the same heartbeats with nothing of ours in flight: the budget is spent
    events = await _events(posting=0, beats=10, budget=5)
    assert [e.code for e in events if isinstance(e, Error)] == ["heartbeat_budget"]
