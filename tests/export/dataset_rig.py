"""Shared pieces of the dataset export tests: a real S3 API on loopback (moto's server mode, a
subprocess on a free port), a small capture database with closed and open sessions, the command
line, and a listing of what a dataset holds."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs
from support import env_without_proxy, free_port, stop_popen, wait_port

from workbench.store.db import Store

BUCKET = "team-captures"


@dataclass
class S3:
    endpoint: str
    env: dict[str, str]  # the AWS variables a process needs to reach it

    def fs(self) -> pafs.S3FileSystem:
        return pafs.S3FileSystem(endpoint_override=self.endpoint, access_key="testing", secret_key="testing",
                                 region="us-east-1", scheme="http", allow_bucket_creation=True)

    def objects(self, prefix: str) -> dict[str, int]:
        """Every object under ``bucket/prefix``: path → size."""
        infos = self.fs().get_file_info(pafs.FileSelector(prefix, recursive=True, allow_not_found=True))
        return {i.path: i.size for i in infos if i.type == pafs.FileType.File}


@contextlib.contextmanager
def moto_s3(*, no_auth_actions: int | None = None) -> Iterator[S3]:
    """``moto_server`` on 127.0.0.1, stopped at the end. ``no_auth_actions``: moto checks credentials
    after that many requests (unknown keys are then refused: a bucket without rights)."""
    exe = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or shutil.which("moto_server")
    assert exe, "moto[server] is in the test extra"
    port = free_port()
    env = env_without_proxy()
    if no_auth_actions is not None:
        env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(no_auth_actions)
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, proc, timeout=60)
        endpoint = f"http://127.0.0.1:{port}"
        yield S3(endpoint, {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
                            "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                            "AWS_EC2_METADATA_DISABLED": "true"})
    finally:
        stop_popen(proc)


def wb(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.Popen[str]:
    """``workbench ARGS`` as a subprocess (a "host"), not waited for."""
    return subprocess.Popen([sys.executable, "-m", "workbench", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env_without_proxy({**os.environ, **(env or {})}))


def run_wb(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> tuple[int, str, str]:
    proc = wb(*args, env=env)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def sample_db(path: Path, sessions: dict[str, str], canary: str | None = None) -> Path:
    """A capture database with one recorded sample turn per session id (``id → status``);
    ``canary``: a credential in every session's request headers and run request (what the write
    gate must redact before anything is stored)."""
    from workbench.decode.classify import default_decoder
    from workbench.samples import sample_turn
    from workbench.schema import pb
    from workbench.store.db import SessionInfo, now_us
    from workbench.store.recorder import Recorder
    from workbench.wire.envelope import encode, split_frames

    with Store(path) as store:
        rec = Recorder(store)
        t = now_us()
        for sid, status in sessions.items():
            dec = default_decoder()
            meta = {"headers": [["authorization", f"Bearer {canary}"], ["x-api-key", canary]]} if canary else {}
            rec.open_session(SessionInfo(sid, source="test", transport="run", status=status, model="claude-x",
                                         client_version="2.1.0", meta=meta))
            streams: dict[tuple[str, str], object] = {}
            for direction, transport, data in sample_turn():
                if canary and direction == "client" and not streams:
                    msg = pb.AgentClientMessage.FromString(split_frames(data)[0].payload)
                    msg.run_request.requested_model.api_key_credentials.api_key = canary
                    data = encode(msg.SerializeToString())
                s = streams.setdefault((direction, transport), dec.stream(transport, direction))
                for f in s.feed(data):  # type: ignore[attr-defined]
                    t += 1500
                    rec.add(sid, t, direction, transport, "1", f)
        rec.flush()
    return path
