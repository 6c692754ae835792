"""The proxy serves only its user (issue 12, item 6), and so do the live service and replay.

Real processes: ``workbench sim`` as the upstream, ``workbench proxy`` in front of it (the OpenAI
SDK as the legitimate client), a writer process serving live reads, ``workbench replay``. Requests
a web page could make — a foreign ``Host`` (DNS rebinding), a foreign ``Origin`` (a cross-origin
``text/plain`` POST needs no preflight), a CORS preflight — are refused with 403 and never reach
the upstream: the simulator logs one line per run, and only the legitimate requests show up.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import ssl
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import openai
import pytest
from security_rig import live_writer
from support import WORKBENCH, Process, start_workbench

from workbench.schema import pb
from workbench.wire.envelope import encode

pytestmark = pytest.mark.slow  # starts subprocesses or servers

CHAT = json.dumps({"model": "default", "messages": [{"role": "user", "content": "hello"}]})


@pytest.fixture(scope="module")
def sim() -> Iterator[tuple[Process, str, str]]:
    p = start_workbench("sim", "--port", "0")
    try:
        p.wait_for(lambda: len(p.out) >= 2)
        url = p.out[0].strip()
        cert = p.out[1].split("cert:", 1)[1].strip()
        yield p, url, cert
    finally:
        p.stop()


def _runs(sim_proc: Process) -> int:
    """Runs the simulator has finished (it logs one summary line per run on stderr)."""
    return sum(1 for line in sim_proc.err if re.match(r"run \d+ ", line))


@pytest.fixture
def proxy_factory(sim: tuple[Process, str, str]) -> Iterator[Callable[..., tuple[Process, str]]]:
    started: list[Process] = []

    def start(*extra: str, env: dict[str, str] | None = None) -> tuple[Process, str]:
        _, url, cert = sim
        p = start_workbench("proxy", "--port", "0", "--upstream", url, "--ca-file", cert, "--model", "default",
                            *extra, env={"CURSOR_ACCESS_TOKEN": "test-token-not-real", **(env or {})})
        started.append(p)
        p.wait_for(lambda: p.out)
        return p, p.out[0].strip()

    yield start
    for p in started:
        p.stop()


def raw(url: str, method: str, path: str, headers: dict[str, str], body: str | bytes = b"",
        tls_context: ssl.SSLContext | None = None) -> tuple[int, str]:
    u = urlsplit(url)
    conn: http.client.HTTPConnection
    if u.scheme == "https":
        conn = http.client.HTTPSConnection(u.hostname or "", u.port, timeout=60, context=tls_context)
    else:
        conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=60)
    try:
        conn.putrequest(method, path, skip_host="host" in {k.lower() for k in headers},
                        skip_accept_encoding=True)
        data = body.encode() if isinstance(body, str) else body
        for k, v in headers.items():
            conn.putheader(k, v)
        conn.putheader("content-length", str(len(data)))
        conn.endheaders(data)
        resp = conn.getresponse()
        return resp.status, resp.read().decode("utf-8", "replace")
    finally:
        conn.close()


def _sdk_chat(url: str, key: str = "sk-anything") -> str:
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)
    out = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "hello"}])
    return out.choices[0].message.content or ""


def test_proxy_refuses_web_pages_and_foreign_hosts(sim: tuple[Process, str, str],
                                                    proxy_factory: Callable[..., tuple[Process, str]]) -> None:
    sim_proc = sim[0]
    proxy, url = proxy_factory()
    port = urlsplit(url).port
    assert _sdk_chat(url)                       # the user's own client works
    sim_proc.wait_for(lambda: _runs(sim_proc) >= 1)
    runs = _runs(sim_proc)
    text = {"content-type": "text/plain"}
    # what issue 12 did: a text/plain POST with Origin/Host evil.example (no preflight needed)
    for headers, word in (({**text, "Host": "evil.example", "Origin": "http://evil.example"}, "Host 'evil.example'"),
                          ({**text, "Host": f"evil.example:{port}"}, "Host 'evil.example'"),
                          ({**text, "Origin": "https://evil.example"}, "Origin 'https://evil.example'"),
                          ({**text, "Origin": "null"}, "Origin 'null'"),
                          ({**text, "Host": "127.0.0.1.evil.example"}, "not a loopback")):
        status, body = raw(url, "POST", "/v1/chat/completions", headers, CHAT)
        assert status == 403, (headers, status, body)
        assert word in json.loads(body)["error"]["message"]
    status, body = raw(url, "OPTIONS", "/v1/chat/completions",
                       {"Origin": "https://evil.example", "Access-Control-Request-Method": "POST",
                        "Access-Control-Request-Headers": "content-type"})
    assert status == 403
    assert "preflight" in body
    assert "access-control-allow" not in body.lower()
    status, body = raw(url, "GET", "/v1/models", {"Host": "evil.example"})
    assert status == 403
    # loopback names are the user's own
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "app.localhost"):
        assert raw(url, "GET", "/v1/models", {"Host": host})[0] == 200, host
    # a malformed chunked body is a 400, not a crash; the proxy keeps serving
    status, body = raw(url, "POST", "/v1/chat/completions",
                       {"Transfer-Encoding": "chunked", "content-type": "application/json"}, b"zz\r\nabc\r\n0\r\n\r\n")
    assert status == 400
    assert "chunk size" in body
    assert _sdk_chat(url)
    sim_proc.wait_for(lambda: _runs(sim_proc) >= runs + 1)
    assert _runs(sim_proc) == runs + 1, "a refused request reached the upstream"
    assert proxy.proc.poll() is None
    assert "Traceback" not in "\n".join(proxy.err)


def test_proxy_allow_host_allow_origin_and_api_key(proxy_factory: Callable[..., tuple[Process, str]]) -> None:
    _, url = proxy_factory("--allow-host", "bridge.example", "--allow-origin", "http://localhost:3000")
    assert raw(url, "GET", "/v1/models", {"Host": "bridge.example"})[0] == 200
    assert raw(url, "GET", "/v1/models", {"Host": "evil.example"})[0] == 403
    assert raw(url, "GET", "/v1/models", {"Origin": "http://localhost:3000"})[0] == 200
    assert raw(url, "GET", "/v1/models", {"Origin": "http://localhost:3001"})[0] == 403
    assert raw(url, "OPTIONS", "/v1/models", {"Origin": "http://localhost:3000",
                                              "Access-Control-Request-Method": "GET"})[0] == 403

    _, url = proxy_factory("--api-key", "s3cret-key")
    status, body = raw(url, "GET", "/v1/models", {})
    assert status == 401
    assert "API key" in body
    assert raw(url, "GET", "/v1/models", {"Authorization": "Bearer wrong"})[0] == 401
    assert raw(url, "GET", "/v1/models", {"Authorization": "Bearer s3cret-key"})[0] == 200
    with pytest.raises(openai.AuthenticationError):
        _sdk_chat(url, "wrong")
    assert _sdk_chat(url, "s3cret-key")
    # the key checks come after Host/Origin: a page holding the key is still refused
    assert raw(url, "GET", "/v1/models", {"Authorization": "Bearer s3cret-key", "Origin": "https://evil.example"})[0] == 403

    proxy, url = proxy_factory(env={"WORKBENCH_PROXY_API_KEY": "env-key"})
    assert raw(url, "GET", "/v1/models", {})[0] == 401
    assert raw(url, "GET", "/v1/models", {"Authorization": "Bearer env-key"})[0] == 200
    assert "env-key" not in "\n".join(proxy.err) + "\n".join(proxy.out)


def test_live_service_checks_host_and_origin(tmp_path: Path) -> None:
    db = tmp_path / "live.duckdb"
    with live_writer(db) as writer:
        side = json.loads(Path(str(db) + ".live.json").read_text())
        url, token = side["url"], side["token"]
        query = json.dumps({"sql": "SELECT count(*) FROM frames"})
        ok = {"x-workbench-token": token, "content-type": "application/json"}
        assert raw(url, "POST", "/query", ok, query)[0] == 200
        for extra in ({"Host": "evil.example"}, {"Host": "rebound.example:80"},
                      {"Origin": "https://evil.example"}, {"Origin": "null"}):
            status, body = raw(url, "POST", "/query", {**ok, **extra}, query)
            assert status == 403, (extra, status, body)
            assert "Host" in body or "Origin" in body, (extra, status, body)
        status, body = raw(url, "OPTIONS", "/query", {"Origin": "https://evil.example",
                                                      "Access-Control-Request-Method": "POST"})
        assert status == 403
        assert raw(url, "POST", "/query", {**ok, "x-workbench-token": "wrong"}, query)[0] == 403
        assert writer.ask("add") == "110"


@pytest.fixture(scope="module")
def fixture_file(sim: tuple[Process, str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A replay fixture recorded from a real run of the built-in client against the simulator."""
    _, url, cert = sim
    work = tmp_path_factory.mktemp("replay")
    db = work / "rec.duckdb"
    env = {**os.environ, "CURSOR_ACCESS_TOKEN": "test-token-not-real"}
    r = subprocess.run([*WORKBENCH, "client", "hello", "--upstream", url, "--ca-file", cert, "--record", str(db)],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    sid = json.loads(subprocess.run([*WORKBENCH, "sessions", "--json", "--db", str(db)], capture_output=True,
                                    text=True, timeout=60, check=True).stdout.splitlines()[0])["session_id"]
    out = work / "fx.json"
    subprocess.run([*WORKBENCH, "export-fixture", sid, "--db", str(db), "-o", str(out)], check=True,
                   capture_output=True, timeout=60)
    return out


def test_replay_checks_host_and_origin(fixture_file: Path) -> None:
    p = start_workbench("replay", str(fixture_file), "--port", "0")
    try:
        p.wait_for(lambda: p.out and p.err)
        url = p.out[0].strip()
        m = re.search(r"certificate (\S+)", "\n".join(p.err))
        assert m, p.err
        ctx = ssl.create_default_context(cafile=m.group(1))
        ctx.check_hostname = False
        envelope = encode(pb.BidiRequestId(request_id="3f2b6c1e-0000-4000-8000-000000000001").SerializeToString())
        for extra in ({"Host": "evil.example"}, {"Origin": "https://evil.example"}):
            headers = {"content-type": "application/connect+proto", **extra}
            status, body = raw(url, "POST", "/agent.v1.AgentService/RunSSE", headers, envelope, ctx)
            assert status == 200, (extra, status, body)
            assert "permission_denied" in body, (extra, status, body)
            assert "workbench replay" in body, (extra, status, body)
            status, body = raw(url, "POST", "/aiserver.v1.BidiService/BidiAppend",
                               {"content-type": "application/proto", **extra}, b"", ctx)
            assert status == 403, (extra, status, body)
            assert "workbench replay" in body, (extra, status, body)
        assert raw(url, "OPTIONS", "/agent.v1.AgentService/Run",
                   {"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}, b"", ctx)[0] >= 400
        # none of that was a run: the real client still gets the recording as run 1
        r = subprocess.run([*WORKBENCH, "client", "hello", "--upstream", url, "--ca-file", m.group(1)],
                           capture_output=True, text=True, timeout=120,
                           env={**os.environ, "CURSOR_ACCESS_TOKEN": "test-token-not-real"})
        assert r.returncode == 0, r.stderr
        p.wait_for(lambda: "run 1 (" in "\n".join(p.err))
        assert "run 1 (" in "\n".join(p.err)
        assert "FAILED" not in "\n".join(p.err)
        assert "run 2 (" not in "\n".join(p.err)
    finally:
        p.stop()
