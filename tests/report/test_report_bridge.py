"""``workbench report`` on both sides of a bridge (docs/bridge.md): an agent run linked to the OpenAI
requests of its conversation gains an "OpenAI client" lane with those requests' messages placed by
time, an OpenAI request an "agent service" lane with its runs'; the facts list the links. Recorded
for real: openai SDK → ``workbench capture --bridge`` → ``workbench proxy`` → ``workbench sim``."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import run_workbench

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bridge"))  # the bridge rig and its turns

from bridge_rig import start_bridge_rig  # noqa: E402
from test_bridge_join import tool_turns  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bridged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[dict[str, Any]]]]:
    rig = start_bridge_rig(tmp_path_factory.mktemp("report-bridge"))
    try:
        tool_turns(rig)
    finally:
        rig.stop()
    r = run_workbench("sessions", "--json", "--db", str(rig.db))
    assert r.returncode == 0, r.stderr
    rows = sorted((json.loads(line) for line in r.stdout.splitlines()), key=lambda s: s["started_at"])
    assert [s["transport"] for s in rows] == ["openai_chat", "run", "openai_chat", "run"]
    yield rig.db, rows


def _svg(db: Path, sid: str, out: Path) -> tuple[str, str]:
    p = run_workbench("report", sid, "--db", str(db), "-o", str(out))
    assert p.returncode == 0, p.stderr
    html = out.read_text()
    start = html.index('id="s0-sequence"')
    return html, html[start:html.index("</svg>", start)]


def _lanes(svg: str) -> dict[str, int]:
    return {name: int(x) for x, name in re.findall(r'<text x="(\d+)" y="20" class="lane-name"[^>]*>([^<]+)</text>', svg)}


def _rows(svg: str) -> list[dict[str, Any]]:
    """Every arrow in order: its session (empty for the reported one's own), label and ends. The
    label is the whole one, from the row's tooltip (the drawn one may be cut to fit its lanes)."""
    out = []
    for m in re.finditer(r'<(a|g) [^>]*class="row[^"]*"(?: data-session="([^"]+)")?[^>]*>(.*?)</\1>', svg, re.S):
        line = re.search(r'<line x1="(\d+)" y1="(\d+)" x2="(\d+)"', m.group(3))
        title = re.search(r"<title>(?:[^<]*? )?seq [^ <]+ [^ <:]+: ([^<]*)</title>", m.group(3))
        drawn = re.search(r'class="label">([^<]*)</text>', m.group(3))
        assert line and title and drawn, m.group(0)
        full = title.group(1)
        assert drawn.group(1) == full or (drawn.group(1).endswith("…") and full.startswith(drawn.group(1)[:-1]))
        label = re.sub(r" · exec \d+$", "", full)
        out.append({"session": m.group(2) or "", "x1": int(line.group(1)), "y": int(line.group(2)),
                    "x2": int(line.group(3)), "label": label})
    return out


def test_an_agent_run_shows_the_openai_client_lane(bridged: tuple[Path, list[dict[str, Any]]], tmp_path: Path) -> None:
    db, (first, asking, follow_up, _continuing) = bridged
    html, svg = _svg(db, asking["session_id"], tmp_path / "run.html")
    lanes = _lanes(svg)
    assert set(lanes) == {"OpenAI client", "client (bridge)", "server"}
    assert lanes["OpenAI client"] < lanes["client (bridge)"] < lanes["server"]
    rows = _rows(svg)
    mine = [r for r in rows if not r["session"]]
    theirs = [r for r in rows if r["session"]]
    # the run's own messages between the bridge and the service, as before
    assert all({r["x1"], r["x2"]} == {lanes["client (bridge)"], lanes["server"]} for r in mine)
    assert mine[0]["label"].startswith("run_request")
    # both requests linked to this run, each message an arrow between the OpenAI client and the bridge
    assert {r["session"] for r in theirs} == {first["session_id"], follow_up["session_id"]}
    assert all({r["x1"], r["x2"]} == {lanes["OpenAI client"], lanes["client (bridge)"]} for r in theirs)
    request = next(r for r in theirs if r["session"] == first["session_id"] and r["label"].startswith("openai.request"))
    assert request["x1"] == lanes["OpenAI client"]  # the client sends it
    calls = [r for r in theirs if r["session"] == first["session_id"] and r["label"].startswith("openai.delta.tool_calls")]
    assert calls and calls[0]["x1"] == lanes["client (bridge)"]  # the bridge streams the call back
    assert any(r["label"].startswith("openai.finish") for r in theirs)
    # placed by time: the request came before the run it caused, the follow-up after the run began
    assert request["y"] < mine[0]["y"]
    follow = next(r for r in theirs if r["session"] == follow_up["session_id"])
    assert follow["y"] > mine[0]["y"]
    # a run of streamed deltas of one kind is one arrow with its count and span
    pieces = [r for r in theirs if "×" in r["label"]]
    assert all(re.match(r"openai\.delta\.\w+ ×\d+ over \d+\.\d{3} s|heartbeat ×", r["label"]) for r in pieces)
    # linked rows draw messages of another session: no link to a frame of this page
    assert {h[1:] for h in re.findall(r'href="(#[^"]+)"', html)} <= set(re.findall(r'id="([^"]+)"', html))
    # the facts list the links: who, role, how
    facts = dict(re.findall(r"<tr><th>([^<]+)</th><td>([^<]*)</td></tr>", html.replace("&#39;", "'")))
    links = [v for k, v in re.findall(r"<tr><th>(bridge link)</th><td>([^<]*)</td></tr>", html.replace("&#39;", "'"))]
    assert "bridge link" in facts and len(links) == 2
    by_id = {v.split(" ", 1)[0]: v for v in links}
    assert set(by_id) == {first["session_id"], follow_up["session_id"]}
    assert "caused" in by_id[first["session_id"]] and "linked by time+prompt" in by_id[first["session_id"]]
    assert "asked" in by_id[follow_up["session_id"]] and "tool_call_id" in by_id[follow_up["session_id"]]


def test_an_openai_request_shows_the_agent_service_lane(bridged: tuple[Path, list[dict[str, Any]]],
                                                        tmp_path: Path) -> None:
    db, (_first, asking, follow_up, continuing) = bridged
    html, svg = _svg(db, follow_up["session_id"], tmp_path / "openai.html")
    lanes = _lanes(svg)
    assert set(lanes) == {"OpenAI client", "bridge", "agent service"}
    rows = _rows(svg)
    theirs = [r for r in rows if r["session"]]
    assert {r["session"] for r in theirs} == {asking["session_id"], continuing["session_id"]}
    assert all({r["x1"], r["x2"]} == {lanes["bridge"], lanes["agent service"]} for r in theirs)
    runs = [r for r in theirs if r["session"] == continuing["session_id"] and r["label"].startswith("run_request")]
    assert runs and runs[0]["x1"] == lanes["bridge"]
    own = [r for r in rows if not r["session"]]
    assert own[0]["label"] == "openai.request" and own[0]["y"] < runs[0]["y"]
    # the runs' streamed pieces collapse as the session's own would, with their count and span
    assert any(re.match(r"stream ×\d+ over \d+\.\d{3} s: \d+ \w+", r["label"]) for r in theirs)
    assert not any(r["label"].startswith("interaction_update.text_delta") for r in theirs)
    assert html.count("<th>bridge link</th>") == 2


def test_an_unlinked_session_has_no_bridge_lane(report_demo: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    db, ids = report_demo
    html, svg = _svg(db, ids["tool_flow"], tmp_path / "plain.html")
    assert set(_lanes(svg)) == {"client", "server"}
    assert all(not r["session"] for r in _rows(svg))
    assert "bridge link" not in html and "Both sides of a bridge" not in html


_FITS = """document.readyState !== 'complete' ? [] : Array.from(document.querySelectorAll('#s0-sequence .row')).map(g => {
    const t = g.querySelector('text.label').getBBox(), l = g.querySelector('line');
    const x1 = Math.min(l.x1.baseVal.value, l.x2.baseVal.value), x2 = Math.max(l.x1.baseVal.value, l.x2.baseVal.value);
    return [g.querySelector('text.label').textContent, t.x >= x1 + 9 && t.x + t.width <= x2 - 9]; })"""


@pytest.mark.usefixtures("need_chromium")
async def test_bridge_lane_labels_stay_between_their_arrowheads(bridged: tuple[Path, list[dict[str, Any]]],
                                                                tmp_path: Path) -> None:
    """Both reports of a bridge in Chromium: every label, the linked sessions' long OpenAI delta runs
    included, sits between its arrow's heads, and the intro counts the heartbeat runs drawn."""
    from web_rig import Browser

    db, (first, asking, follow_up, _continuing) = bridged
    browser = Browser(width=1400, height=900)
    try:
        for sid in (asking["session_id"], follow_up["session_id"]):
            out = tmp_path / f"{sid[:8]}.html"
            html, svg = _svg(db, sid, out)
            page = await browser.page()
            await page.navigate(out.resolve().as_uri())
            fits = []
            for _ in range(600):  # until the diagram is laid out (30 s on a busy machine)
                fits = await page.evaluate(_FITS)
                if fits:
                    break
                await asyncio.sleep(0.05)
            assert fits and all(ok for _, ok in fits), [label for label, ok in fits if not ok]
            await page.screenshot(tmp_path / f"{sid[:8]}.png")
            await page.close()
            drawn = len(re.findall(r'class="label">heartbeat ×\d+', svg))
            said = re.search(r"\((\d+) heartbeat runs?", html)
            assert said and int(said.group(1)) == drawn
    finally:
        browser.close()
