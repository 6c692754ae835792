"""``workbench report`` on recorded sessions: one self-contained file (nothing external), findings
linking to frames that exist, the diagram with the collapsed heartbeats and the stall, tool calls,
blobs, every frame with its tree; ``--redact content``; bad input."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from support import run_workbench

pytestmark = pytest.mark.slow


class Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.hrefs: list[str] = []
        self.external: list[str] = []
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append((tag, a))
        if a.get("id"):
            self.ids.add(str(a["id"]))
        if a.get("href") is not None:
            self.hrefs.append(str(a["href"]))
        for key in ("src", "srcset", "data", "action", "poster", "xlink:href"):
            if a.get(key):
                self.external.append(f"{tag} {key}={a[key]}")
        if tag == "link":
            self.external.append(f"link {a}")


def _report(db: Path, out: Path, *args: str) -> tuple[str, Page]:
    p = run_workbench("report", *args, "--db", str(db), "-o", str(out))
    assert p.returncode == 0, p.stderr
    assert f"wrote {out}" in p.stdout
    html = out.read_text()
    page = Page()
    page.feed(html)
    return html, page


def test_report_of_the_heartbeat_loop(report_demo: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    db, ids = report_demo
    html, page = _report(db, tmp_path / "r.html", ids["heartbeat_loop"], ids["tool_flow"][:8])
    # self-contained: no external reference of any kind, and a policy that forbids fetching
    assert not page.external
    assert all(h.startswith("#") for h in page.hrefs), [h for h in page.hrefs if not h.startswith("#")]
    style = html[html.index("<style>"):html.index("</style>")]
    assert not re.search(r"url\(|@import|https?:", style)
    assert not re.search(r"https?://", html.replace('xmlns="http://www.w3.org/2000/svg"', ""))
    assert "default-src 'none'" in html
    # every link lands on an element of the page, evidence links on frames
    assert {h[1:] for h in page.hrefs} <= page.ids
    evidence = [h for h in page.hrefs if "-frame-" in h]
    assert evidence
    # both sessions, each with its facts and findings
    sections = [a for t, a in page.tags if t == "section"]
    assert [a["data-session"] for a in sections] == [ids["heartbeat_loop"], ids["tool_flow"]]
    codes = {a["data-code"] for t, a in page.tags if t == "div" and a.get("data-code")}
    assert {"missing_stream_close", "heartbeat_loop"} <= codes
    # the diagram: the heartbeats collapsed into one row with their count, the stall marked
    svg = html[html.index('id="s0-sequence"'):html.index("</svg>", html.index('id="s0-sequence"'))]
    beats = re.search(r"heartbeat ×(\d+) over", svg)
    assert beats and int(beats.group(1)) >= 5
    assert svg.count("interaction_update.heartbeat") == 0   # not one arrow per heartbeat
    assert 'id="s0-stall"' in svg and "stall: no progress after seq" in svg
    assert "no stream_close" in svg  # the exec bar that never closed
    assert 'id="s1-stall"' not in html  # the healthy run has none
    # one expandable frame per frame, with its tree
    frames = [a for t, a in page.tags if t == "details" and a.get("id", "").startswith("s0-frame-")]
    n = int(re.search(r"<th>frames</th><td>(\d+)</td>", html).group(1))  # type: ignore[union-attr]
    assert len(frames) == n
    assert "echo hello from workbench" in html  # the shell command in the exec's tree and the tool call
    assert '<ul class="tree">' in html


def test_redact_content_hides_prompts_commands_and_blobs(report_demo: tuple[Path, dict[str, str]],
                                                         tmp_path: Path) -> None:
    db, ids = report_demo
    html, page = _report(db, tmp_path / "r.html", ids["heartbeat_loop"], "--redact", "content")
    assert "List the files here" not in html          # the prompt (run_request, KV blob previews)
    assert "echo hello from workbench" not in html    # the command in the exec, the tool call args, the result
    assert "You are an AI coding assistant" not in html
    assert "[redacted sha256:" in html
    assert "<td>content</td>" in html
    # the shape is still all there
    assert "heartbeat ×" in html and 'id="s0-stall"' in html


def test_redact_content_also_scrubs_what_findings_quote(report_demo: tuple[Path, dict[str, str]],
                                                        tmp_path: Path) -> None:
    # the KV-only answer's finding quotes the tool call the blob holds: its command is content
    db, ids = report_demo
    plain, _ = _report(db, tmp_path / "s.html", ids["kv_only_answer"])
    hidden, _ = _report(db, tmp_path / "c.html", ids["kv_only_answer"], "--redact", "content")
    quoted = re.search(r'data-code="kv_only_response">\s*<div>.*?</div>\s*<div>(.*?)</div>', plain, re.S)
    assert quoted and "Hello from KV blob investigation" in quoted.group(1)
    assert "Hello from KV blob investigation" not in hidden
    assert 'data-code="kv_only_response"' in hidden


def test_json_says_what_was_written(report_demo: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    db, ids = report_demo
    out = tmp_path / "sub" / "r.html"
    p = run_workbench("report", ids["tool_flow"], "--db", str(db), "-o", str(out), "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["path"] == str(out) and doc["bytes"] == out.stat().st_size and doc["redact"] == "secrets"


def test_bad_input_exit_2(report_demo: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    db, _ = report_demo
    p = run_workbench("report", "nope", "--db", str(db), "-o", str(tmp_path / "r.html"))
    assert p.returncode == 2 and "'nope'" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "r.html").exists()
    p = run_workbench("report", "x", "--db", str(tmp_path / "missing.duckdb"), "-o", str(tmp_path / "r.html"))
    assert p.returncode == 2 and "missing.duckdb" in p.stderr
