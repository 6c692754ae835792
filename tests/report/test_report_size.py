"""The size of a report of a 1,000-frame session (docs/report.md states it): the table has every
frame, the pictures stay small because runs are collapsed and the timeline is binned."""

from __future__ import annotations

from pathlib import Path

from workbench.report.build import read_for_report
from workbench.report.render import render_report
from workbench.store.reader import open_reader
from workbench.tui.sample_db import build_big_db


def test_report_of_1000_frames_is_shareable(tmp_path: Path) -> None:
    db = build_big_db(tmp_path / "big.duckdb", 1000)
    reader = open_reader(db)
    try:
        rs = read_for_report(reader, "big")
    finally:
        reader.close()
    html = render_report([rs])
    size = len(html.encode())
    print(f"report of a {rs.frame_count}-frame session: {size:,} bytes")
    assert rs.frame_count == len(rs.view.frames) == 1000
    assert html.count('<details id="s0-frame-') == 1000
    assert size < 3_000_000
    # the diagram collapses: far fewer arrows than frames
    svg = html[html.index('id="s0-sequence"'):html.index("</svg>")]
    assert svg.count("<line") < 600
