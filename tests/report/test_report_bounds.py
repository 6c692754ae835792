"""The report of a big session stays bounded (issue 35): runs collapsed, at most ``MAX_ROWS`` diagram
rows with the rest one row that says how to list them, the frame table the first ``--max-frames``
plus what the page links to; the intro's heartbeat-run count is the diagram's. And what a newcomer
saw in reports (item 6): labels that overflow their lanes, two contents entries alike, ``(0
heartbeat runs)`` beside a diagram of heartbeat runs, a summary cut mid-word. Sizes, not times
(benchmarks/report.py times it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support import run_workbench

from workbench.decode.classify import SERVER_MSG, default_decoder
from workbench.protocol import kinds
from workbench.report.diagram import CHAR_W, HEAD_ROOM, MAX_ROWS, DiagramBuilder
from workbench.report.session import LinkedFrame, LinkedSession
from workbench.report.shape import StallWatch
from workbench.schema import pb
from workbench.store.db import SessionInfo, Store
from workbench.tui.sample_db import BASE_US, build_big_db


def _svg(html: str, anchor: str = "s0") -> str:
    start = html.index(f'id="{anchor}-sequence"')
    return html[start:html.index("</svg>", start)]


@pytest.mark.slow
def test_report_of_a_50k_frame_session_is_bounded(tmp_path: Path) -> None:
    db = build_big_db(tmp_path / "big.duckdb", 50_000)   # 160 deltas then 40 heartbeats, 250 times
    out = tmp_path / "big.html"
    p = run_workbench("report", "big", "--db", str(db), "-o", str(out), "--max-frames", "1000")
    assert p.returncode == 0, p.stderr
    html = out.read_text()
    size = len(html.encode())
    print(f"report of a 50,000-frame session: {size:,} bytes, {html.count('<text'):,} SVG texts")
    assert size < 2_000_000
    svg = _svg(html)
    rows = re.findall(r'<a href="#s0-frame-(\d+)" class="row', svg)
    assert len(rows) <= MAX_ROWS
    assert svg.count("<text") <= 2 * MAX_ROWS + 10        # an offset and a label a row, the lanes, the left-out row
    # the runs are collapsed: one row per run of 160 deltas and per run of 40 heartbeats
    labels = re.findall(r'class="label">([^<]*)</text>', svg)
    assert sum(lb.startswith("stream ×160 over 3.180 s") for lb in labels) == MAX_ROWS // 2
    shown_beats = sum(lb.startswith("heartbeat ×40") for lb in labels)
    assert shown_beats == MAX_ROWS // 2
    # the rows between are one row that says what they are and how to list them
    assert 'id="s0-left-out"' in svg
    left = re.search(r"… ([\d,]+) messages \(([\d,]+) rows\), seq (\d+)–(\d+), left out", svg)
    assert left, svg[svg.index('id="s0-left-out"'):][:600]
    assert int(left.group(2).replace(",", "")) == 500 - MAX_ROWS
    assert f"workbench frames big --from {left.group(3)}" in svg
    # the intro counts every heartbeat run, and says how many are in the rows left out
    intro = re.search(r"\((\d+) heartbeat runs?(?:,\s+(\d+) of them in the rows left out)?\)", html)
    assert intro and int(intro.group(1)) == 250
    assert int(intro.group(1)) - int(intro.group(2) or 0) == shown_beats
    # the frame table: the first 1,000 frames and every frame the page links to, and where the rest are
    frames = re.findall(r'<details id="s0-frame-(\d+)"', html)
    assert 1000 <= len(frames) <= 1000 + MAX_ROWS + 50
    assert {h for h in re.findall(r'href="#(s0-frame-\d+)"', html)} <= {f"s0-frame-{s}" for s in frames}
    assert "workbench frames big --from 1000" in html
    # and the command the page names lists them from there
    listed = run_workbench("frames", "big", "--db", str(db), "--from", left.group(3), "--limit", "2")
    assert listed.returncode == 0, listed.stderr
    assert [int(line.split()[0]) for line in listed.stdout.splitlines()] == [int(left.group(3)), int(left.group(3)) + 1]
    assert "<th>frames</th><td>50000</td>" in html


def _frames(spec: list[tuple[str, str]], step_us: int = 1000) -> list[LinkedFrame]:
    return [LinkedFrame(i, BASE_US + i * step_us, d, k) for i, (d, k) in enumerate(spec)]


def test_linked_heartbeat_runs_are_counted_and_labels_fit_their_lanes() -> None:
    own = _frames([("client", kinds.RUN_REQUEST), ("server", kinds.TEXT_DELTA), ("server", kinds.TEXT_DELTA),
                   ("server", "interaction_update.turn_ended")])
    # the OpenAI side: a long-named delta run, then heartbeats (56 of them), as a bridge's request shows
    theirs = _frames([("client", kinds.OPENAI_REQUEST)] + [("server", kinds.OPENAI_TOOL_CALLS)] * 30
                     + [("server", kinds.SERVER_HEARTBEAT)] * 56, step_us=100)
    link = LinkedSession("c4153c0d-0000-4000-8000-000000000001", "openai_chat", "caused", ["time"], theirs)
    builder = DiagramBuilder(own[0].ts_us, "run", [link])
    stall = StallWatch()
    for f in own:
        builder.add(f)
        stall.add(f)
    d = builder.finish(stall.stall(), [])
    beats = [r for r in d.rows if r.shown.startswith("heartbeat ×")]
    assert len(beats) == 1 and beats[0].label.startswith("heartbeat ×56")
    assert d.heartbeat_runs == 1            # the intro's count is the diagram's
    for r in d.rows:
        room = abs(r.x2 - r.x1) - 2 * HEAD_ROOM
        assert len(r.shown) * CHAR_W <= room, (r.shown, room)
        assert r.shown == r.label or r.shown.endswith("…")
    assert any(r.shown.endswith("…") for r in d.rows) or all(len(r.label) * CHAR_W <= 300 for r in d.rows)


@pytest.mark.slow
def test_two_sessions_with_one_label_have_distinct_contents_entries(tmp_path: Path) -> None:
    db = tmp_path / "two.duckdb"
    hb = default_decoder().classify_agent(pb.AgentServerMessage(
        interaction_update=pb.InteractionUpdate(heartbeat=pb.Heartbeat())).SerializeToString(), SERVER_MSG)
    with Store(db) as store:
        from workbench.store.recorder import Recorder

        rec = Recorder(store)
        for sid in ("aaaa1111-first", "bbbb2222-second"):
            rec.open_session(SessionInfo(sid, source="capture", transport="run", label="heartbeat_loop",
                                         status="aborted"))
            for i in range(3):
                rec.add(sid, BASE_US + i * 1000, "server", "run", "1", hb)
        rec.flush()
    out = tmp_path / "two.html"
    p = run_workbench("report", "aaaa", "bbbb", "--db", str(db), "-o", str(out))
    assert p.returncode == 0, p.stderr
    html = out.read_text()
    nav = re.findall(r'<a href="#s\d">([^<]+)</a>', html[html.index("<nav>"):html.index("</nav>")])
    assert len(nav) == 2 and nav[0] != nav[1], nav
    assert all("heartbeat_loop" in n for n in nav)


def test_a_partial_tool_calls_cut_summary_says_so() -> None:
    args = '{"command": "echo hello from workbench", "working_directory": ""}'
    f = default_decoder().classify_agent(pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(
        partial_tool_call=pb.PartialToolCall(call_id="toolu_1", args_text_delta=args))).SerializeToString(),
        SERVER_MSG)
    tail = f.summary.split(" chars ", 1)[1]
    assert tail.startswith('"…') and tail.endswith('\\"\\"}"'), f.summary
    short = default_decoder().classify_agent(pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(
        partial_tool_call=pb.PartialToolCall(call_id="toolu_1", args_text_delta="{}"))).SerializeToString(),
        SERVER_MSG)
    assert short.summary.endswith('chars "{}"')
