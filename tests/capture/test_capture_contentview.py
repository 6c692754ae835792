"""The "Cursor agent" contentview: mitmproxy shows agent bodies decoded frame by frame.

Real traffic: the simulated backend (gzip on for clients that accept it), a real mitmdump with the
capture addon writing a flow file (``-w``) and printing every body (``flow_detail=4``), and real
clients (the built-in client over Run / RunSSE + BidiAppend / RunPoll / gRPC-Web, and the plain-h2
test client asking for gzip). The flow file is then rendered through mitmproxy's own view
machinery, the functions mitmweb and the console call: ``contentviews.prettify_message`` and the
registry's choice on mitmproxy 12, ``contentviews.get_message_content_view`` on 11.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from capture_rig import ADDON, BIN
from h2_agent_client import H2AgentClient
from mitmproxy import contentviews, http, io
from mitmproxy.test import taddons, tflow, tutils
from support import free_port, proxied_environ, wait_port

from workbench.capture import contentview
from workbench.capture.addon import CursorCapture
from workbench.capture.contentview import MITM12, NAME, CursorAgentView
from workbench.schema import pb
from workbench.wire.envelope import encode

TOKEN = "view-test-token"


@dataclass
class Recorded:
    flows: list[http.HTTPFlow]
    dump: str           # what mitmdump printed with flow_detail=4
    prompts: dict[str, str]


def _lines(message: http.Message, flow: http.HTTPFlow) -> tuple[str, str]:
    """The description and text mitmproxy's automatic choice of view shows for this message."""
    if MITM12:
        res = contentviews.prettify_message(message, flow)
        assert res.view_name == NAME, (res.view_name, res.text[:500])
        desc, blank, text = res.text.partition("\n\n")  # our first line is the description
        assert blank, res.text[:500]
        return desc, text
    desc, lines, error = contentviews.get_message_content_view("auto", message, flow)
    assert error is None, error
    return desc, "\n".join("".join(text for _, text in line) for line in lines)


def _priority(view: CursorAgentView, data: bytes, flow: http.HTTPFlow, message: http.Message) -> float:
    if MITM12:
        return float(view.render_priority(data, contentviews.Metadata(flow=flow, http_message=message)))
    return float(view.render_priority(data, flow=flow, http_message=message))  # type: ignore[call-arg]


def _view_text(view: CursorAgentView, data: bytes, flow: http.HTTPFlow, message: http.Message) -> str:
    """The view called through the API of this mitmproxy line (no description)."""
    if MITM12:
        return str(view.prettify(data, contentviews.Metadata(flow=flow, http_message=message))).partition("\n\n")[2]
    _desc, lines = view(data, flow=flow, http_message=message)  # type: ignore[operator]
    return "\n".join("".join(t for _, t in line) for line in lines)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    d = tmp_path_factory.mktemp("contentview")
    sim = subprocess.Popen([str(BIN / "workbench"), "sim", "--port", "0", "--gzip-over", "16",
                            "--heartbeat-interval", "30", "--cert-dir", str(d / "certs"), "--quiet"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert sim.stdout is not None
    url = sim.stdout.readline().strip()
    assert url.startswith("https://127.0.0.1:"), url
    port = free_port()
    flows_file = d / "agent.flows"
    log_path = d / "mitmdump.log"
    with log_path.open("w") as log:
        mitm = subprocess.Popen(
            [str(BIN / "mitmdump"), "-s", str(ADDON), "--listen-host", "127.0.0.1", "--listen-port", str(port),
             "--set", f"confdir={d / 'mitm'}", "--set", "ssl_insecure=true", "--set", f"cursor_db={d / 'c.duckdb'}",
             "--set", "flow_detail=4", "-w", str(flows_file)],
            stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        wait_port(port, mitm)
        proxy = f"http://127.0.0.1:{port}"
        ca = str(d / "mitm" / "mitmproxy-ca-cert.pem")
        prompts = {"run": "[scenario:text] hello from the view test",
                   "runsse": "[scenario:tool_flow] list the files",
                   "runpoll": "[scenario:text] poll me",
                   "grpc-web": "[scenario:text] mode d",
                   "error": "[scenario:rate_limit] too much"}
        asyncio.run(_drive(url, proxy, ca, prompts))
        # the plain-h2 client asks for gzip: the simulator compresses its frames
        res = H2AgentClient(url, token=TOKEN, ca_file=ca, proxy=proxy,
                            extra_headers=[("connect-accept-encoding", "gzip")]).run_turn("[scenario:text] gzip please")
        assert res.status == 200
    finally:
        mitm.send_signal(signal.SIGINT)
        mitm.wait(60)
        sim.send_signal(signal.SIGTERM)
        sim.wait(30)
    with flows_file.open("rb") as fh:
        flows = [f for f in io.FlowReader(fh).stream() if isinstance(f, http.HTTPFlow)]
    contentview.register()
    try:
        # mitmproxy 12's view machinery reads its options (protobuf_definitions) from a running master
        with taddons.context():
            yield Recorded(flows, log_path.read_text(errors="replace"), prompts)
    finally:
        contentview.unregister()


async def _drive(url: str, proxy: str, ca: str, prompts: dict[str, str]) -> None:
    from workbench.client.agent import AgentClient

    with proxied_environ(HTTPS_PROXY=proxy):
        for name, transport, framing in (("run", "run", "connect"), ("runsse", "runsse", "connect"),
                                         ("runpoll", "runpoll", "connect"), ("grpc-web", "runsse", "grpc-web"),
                                         ("error", "run", "connect")):
            async with AgentClient(url, TOKEN, transport=transport, framing=framing, verify=ca) as client:
                await asyncio.wait_for(client.run_turn(prompts[name], raise_on_error=False), 60)


def _flows(rec: Recorded, path_end: str) -> list[http.HTTPFlow]:
    return [f for f in rec.flows if f.request.path.endswith(path_end)]


def _flow_with_prompt(rec: Recorded, path_end: str, prompt: str) -> http.HTTPFlow:
    for f in _flows(rec, path_end):
        if prompt.encode() in (f.request.raw_content or b""):
            return f
    raise AssertionError(f"no {path_end} flow carries {prompt!r}")


@pytest.mark.slow  # workbench sim, mitmdump and real clients
def test_run_request_and_response_are_shown_frame_by_frame(recorded: Recorded) -> None:
    flow = _flow_with_prompt(recorded, "/Run", recorded.prompts["run"])
    desc, text = _lines(flow.request, flow)
    assert desc.startswith(f"{NAME}: Run client→server")
    assert "#0 → run_request" in text and recorded.prompts["run"] in text
    assert "user_message:" in text and "text:" in text      # the named tree
    assert flow.response is not None
    desc, text = _lines(flow.response, flow)
    assert desc.startswith(f"{NAME}: Run server→client")
    assert "← interaction_update.text_delta" in text and "← interaction_update.turn_ended" in text
    assert "← end_stream" in text and "[end-stream]" in text
    assert "interaction_update:" in text                     # fields under their schema names


@pytest.mark.slow  # workbench sim, mitmdump and real clients
def test_runsse_and_bidiappend_are_unwrapped(recorded: Recorded) -> None:
    sse = [f for f in _flows(recorded, "/RunSSE") if f.request.headers.get("content-type", "").startswith(
        "application/connect")]
    assert sse
    desc, text = _lines(sse[0].request, sse[0])
    assert "bidi_request_id" in text
    appends = _flows(recorded, "/BidiAppend")
    rendered = [_lines(f.request, f) for f in appends]
    assert all(d.startswith(f"{NAME}: BidiAppend client→server") for d, _ in rendered)
    # the AgentClientMessage inside the BidiAppendRequest, with its seqno
    first = next(t for _, t in rendered if recorded.prompts["runsse"] in t)
    assert "#0 → run_request" in first and "seqno 0" in first
    assert any("exec_client_message" in t for _, t in rendered)
    responses = [_lines(f.response, f)[1] for f in _flows(recorded, "/RunSSE") if f.response is not None]
    assert any("exec_server_message" in t for t in responses)


@pytest.mark.slow  # workbench sim, mitmdump and real clients
def test_runpoll_responses_are_unwrapped(recorded: Recorded) -> None:
    polls = _flows(recorded, "/RunPoll")
    assert polls
    texts = [_lines(f.response, f)[1] for f in polls if f.response is not None]
    assert any("interaction_update.text_delta" in t for t in texts)


@pytest.mark.slow  # workbench sim, mitmdump and real clients
def test_gzip_frames_are_inflated_and_marked(recorded: Recorded) -> None:
    flows = [f for f in _flows(recorded, "/Run") if b"gzip please" in (f.request.raw_content or b"")]
    assert flows and flows[0].response is not None
    _, text = _lines(flows[0].response, flows[0])
    # the frame was inflated and classified: its kind, summary and fields, marked as gzip
    gz = [block for block in text.split("\n#") if "[gzip]" in block.splitlines()[0]]
    assert gz and "set_blob_args" in gz[0] and "blob_data:" in gz[0]


@pytest.mark.slow  # workbench sim, mitmdump and real clients
def test_error_end_stream_and_grpc_web_trailer(recorded: Recorded) -> None:
    flow = _flow_with_prompt(recorded, "/Run", recorded.prompts["error"])
    assert flow.response is not None
    _, text = _lines(flow.response, flow)
    assert "end_stream.error" in text and "resource_exhausted" in text
    trailers = [(_lines(f.response, f)[1]) for f in _flows(recorded, "/RunSSE")
                if f.response is not None and "grpc-web" in f.response.headers.get("content-type", "")]
    assert trailers and any("[grpc-web trailer]" in t and "grpc-status" in t for t in trailers)


@pytest.mark.slow  # workbench sim, mitmdump and real clients
def test_mitmdump_picks_the_view_for_agent_flows(recorded: Recorded) -> None:
    """mitmdump's own output (flow_detail=4) went through the view: frame lines, decoded trees."""
    assert "#0 → run_request" in recorded.dump
    assert recorded.prompts["run"] in recorded.dump
    assert "← interaction_update.text_delta" in recorded.dump
    assert "← end_stream" in recorded.dump


def test_priority_only_for_agent_flows() -> None:
    view = CursorAgentView()
    body = encode(pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(
        text_delta=pb.TextDelta(text="hi"))).SerializeToString())
    agent = tflow.tflow(req=tutils.treq(host="api2.cursor.sh", path="/agent.v1.AgentService/Run",
                                        headers=http.Headers(content_type="application/connect+proto")),
                        resp=tutils.tresp(content=body))
    other = tflow.tflow(resp=tutils.tresp(content=body))
    assert _priority(view, body, agent, agent.response) > 1.5
    assert _priority(view, body, other, other.response) <= 0
    assert _priority(view, b"", agent, agent.response) <= 0
    text = _view_text(view, body, agent, agent.response)
    assert "← interaction_update.text_delta" in text and '"hi"' in text


def test_undecodable_bytes_are_shown_with_an_error_not_dropped() -> None:
    view = CursorAgentView()
    body = encode(b"\xff\xff\xff not protobuf")
    flow = tflow.tflow(req=tutils.treq(host="api2.cursor.sh", path="/agent.v1.AgentService/Run"),
                       resp=tutils.tresp(content=body))
    text = _view_text(view, body, flow, flow.response)
    assert "malformed" in text and "error:" in text and "$hex" in text


def _agent_flow(body: bytes) -> http.HTTPFlow:
    return tflow.tflow(req=tutils.treq(host="api2.cursor.sh", path="/agent.v1.AgentService/Run",
                                       headers=http.Headers(content_type="application/connect+proto")),
                       resp=tutils.tresp(content=body))


def test_the_addon_puts_the_view_in_mitmproxys_list_without_a_warning(tmp_path: Path) -> None:
    """What mitmweb and the console offer: the registry's views; on 12 the deprecated ``View`` API
    warned at load (``contentviews.add``) and at class definition."""
    body = encode(pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(
        text_delta=pb.TextDelta(text="from the registry"))).SerializeToString())
    flow = _agent_flow(body)
    assert flow.response is not None
    addon = CursorCapture()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with taddons.context(addon) as tctx:
            tctx.configure(addon, cursor_db=str(tmp_path / "view.duckdb"), cursor_live=False)
            if MITM12:
                assert "cursor agent" in contentviews.registry.available_views()
                assert contentviews.registry["Cursor agent"].name == NAME
            else:
                assert contentviews.get(NAME) is not None
            desc, text = _lines(flow.response, flow)
            assert desc.startswith(f"{NAME}: Run server→client, 1 frame")
            assert "← interaction_update.text_delta" in text and "from the registry" in text
            addon.done()
            # once the addon is done, the view no longer takes agent flows by default
            if MITM12:
                assert contentviews.prettify_message(flow.response, flow).view_name != NAME
            else:
                assert contentviews.get(NAME) is None
    ours = [w for w in caught if "workbench" in str(w.filename) or "contentview" in str(w.message).lower()
            or "View" in str(w.message)]
    assert ours == [], [f"{w.filename}:{w.lineno}: {w.message}" for w in ours]
