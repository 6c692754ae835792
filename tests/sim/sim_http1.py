"""HTTP/1.1 RunSSE/RunPoll + BidiAppend client for the simulator tests (httpx, TLS)."""

from __future__ import annotations

import asyncio
import ssl
import uuid
from typing import Any

import httpx
from sim_h2 import server_msg

from workbench.decode import default_decoder
from workbench.decode.classify import Frame
from workbench.schema import pb
from workbench.wire.envelope import encode

RUNSSE = "/agent.v1.AgentService/RunSSE"
RUNPOLL = "/agent.v1.AgentService/RunPoll"
APPEND = "/aiserver.v1.BidiService/BidiAppend"
MODELS = "/agent.v1.AgentService/GetUsableModels"
AUTH = {"authorization": "Bearer test-token"}


def append_body(request_id: str, seqno: int, msg: Any, raw_field4: bool = False) -> bytes:
    data = msg if isinstance(msg, bytes) else bytes(msg.SerializeToString())
    req = pb.BidiAppendRequest(request_id=pb.BidiRequestId(request_id=request_id), append_seqno=seqno)
    if raw_field4:
        req.data_bytes = data
    else:
        req.data = data.hex()
    return bytes(req.SerializeToString())


class BidiRun:
    """One RunSSE or RunPoll stream plus its BidiAppend write side, as the CLI's HTTP/1.1 mode does it."""

    def __init__(self, http: httpx.AsyncClient, base: str, transport: str = "runsse") -> None:
        self.http = http
        self.base = base
        self.transport = transport
        self.request_id = str(uuid.uuid4())
        self.seqno = 0
        self.frames: asyncio.Queue[Frame | None] = asyncio.Queue()
        self.status: int | None = None
        self.content_type: str | None = None
        self.error: BaseException | None = None  # how the pump ended (after close())
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        rid = pb.BidiRequestId(request_id=self.request_id)
        if self.transport == "runsse":
            path, body = RUNSSE, encode(rid.SerializeToString())
        else:
            path, body = RUNPOLL, encode(pb.BidiPollRequest(request_id=rid, start_request=True).SerializeToString())
        ready = asyncio.Event()

        async def pump() -> None:
            dec = default_decoder().stream(self.transport, "server")
            headers = {**AUTH, "content-type": "application/connect+proto", "x-request-id": self.request_id}
            try:
                async with self.http.stream("POST", self.base + path, content=body, headers=headers) as resp:
                    self.status = resp.status_code
                    self.content_type = resp.headers.get("content-type")
                    ready.set()
                    async for chunk in resp.aiter_raw():
                        for f in dec.feed(chunk):
                            assert f.kind != "malformed", f
                            assert f.error is None, f
                            self.frames.put_nowait(f)
                for f in dec.close():
                    self.frames.put_nowait(f)
            finally:
                ready.set()
                self.frames.put_nowait(None)

        self._task = asyncio.get_running_loop().create_task(pump())
        await asyncio.wait_for(ready.wait(), 30)

    async def append(self, msg: Any, seqno: int | None = None, raw_field4: bool = False) -> httpx.Response:
        if seqno is None:
            seqno = self.seqno
            self.seqno += 1
        return await self.http.post(self.base + APPEND, content=append_body(self.request_id, seqno, msg, raw_field4),
                                    headers={**AUTH, "content-type": "application/proto"})

    async def close(self) -> None:
        """Stop reading (the pump task must not outlive the test's event loop)."""
        if self._task is not None:
            self._task.cancel()
            self.error = (await asyncio.gather(self._task, return_exceptions=True))[0]

    async def next(self, timeout: float = 30) -> Frame | None:
        return await asyncio.wait_for(self.frames.get(), timeout)

    async def until_end(self) -> list[Frame]:
        """All frames to the end of the stream, answering KV requests through BidiAppend."""
        out: list[Frame] = []
        blobs: dict[bytes, bytes] = {}
        while (f := await self.next()) is not None:
            out.append(f)
            if f.kind.startswith("kv_server_message"):
                kv = server_msg(f).kv_server_message
                if f.kind.endswith("set_blob_args"):
                    blobs[bytes(kv.set_blob_args.blob_id)] = bytes(kv.set_blob_args.blob_data)
                    res = pb.KvClientMessage(id=kv.id, set_blob_result=pb.SetBlobResult())
                else:
                    res = pb.KvClientMessage(id=kv.id, get_blob_result=pb.GetBlobResult())
                    if bytes(kv.get_blob_args.blob_id) in blobs:
                        res.get_blob_result.blob_data = blobs[bytes(kv.get_blob_args.blob_id)]
                r = await self.append(pb.AgentClientMessage(kv_client_message=res))
                assert r.status_code == 200, r.text
        return out


def trust(sim: Any) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(sim.cert_path))


def http1(sim: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(http1=True, http2=False, verify=trust(sim), timeout=30)
