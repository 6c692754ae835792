"""The report of the heartbeat loop in a real headless Chromium (Debian's, over the DevTools
protocol: tests/web/web_rig.py): it renders, the diagram shows the collapsed heartbeats and the
stall, an evidence link and a diagram arrow jump to their frame (opened, on screen), and the page
fetches nothing from the network."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from support import run_workbench
from web_rig import Browser, Page

pytestmark = pytest.mark.slow


async def _wait(page: Page, expression: str, what: str, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = await page.evaluate(expression)
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"page never showed {what} ({expression})")
        await asyncio.sleep(0.05)


async def _click(page: Page, selector: str) -> None:
    """A real mouse click at the centre of the element (scrolled into view first)."""
    box = await page.evaluate(
        f"(() => {{ const e = document.querySelector({selector!r}); e.scrollIntoView({{block: 'center'}});"
        " const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()")
    x, y = box
    for kind in ("mousePressed", "mouseReleased"):
        await page.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)


_FRAME_SHOWN = ("(() => {{ const d = document.getElementById({id!r}); if (!d || !d.open || location.hash !== '#' + {id!r})"
                " return false; const r = d.getBoundingClientRect(); return r.top >= 0 && r.top < innerHeight; }})()")


@pytest.mark.usefixtures("need_chromium")
async def test_report_renders_and_links_jump(report_demo: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    db, ids = report_demo
    out = tmp_path / "heartbeat-loop.html"
    p = run_workbench("report", ids["heartbeat_loop"], "--db", str(db), "-o", str(out))
    assert p.returncode == 0, p.stderr
    url = out.resolve().as_uri()
    browser = Browser(width=1400, height=900)
    try:
        page = await browser.page()
        await page.navigate(url)
        await _wait(page, "document.readyState === 'complete' && !!document.getElementById('s0-sequence')", "the report")
        # the diagram is drawn: its rows have a size, one of them the collapsed heartbeats, and the stall band
        rows = await page.evaluate("Array.from(document.querySelectorAll('#s0-sequence a.row text.label'))"
                                   ".map(t => [t.textContent, t.getBBox().width])")
        assert rows and all(w > 0 for _, w in rows)
        beats = [t for t, _ in rows if t.startswith("heartbeat ×")]
        assert len(beats) == 1, rows
        # each label sits between its arrow's heads (no label over an arrowhead or into another lane), above
        # its arrow with a halo, so no arrow runs through its text
        fits = await page.evaluate("""Array.from(document.querySelectorAll('#s0-sequence .row')).map(g => {
            const t = g.querySelector('text.label').getBBox(), l = g.querySelector('line');
            const x1 = Math.min(l.x1.baseVal.value, l.x2.baseVal.value), x2 = Math.max(l.x1.baseVal.value, l.x2.baseVal.value);
            return [g.querySelector('text.label').textContent, t.x >= x1 + 9 && t.x + t.width <= x2 - 9,
                    t.y + t.height <= l.y1.baseVal.value + 1,
                    getComputedStyle(g.querySelector('text.label')).paintOrder.startsWith('stroke')]; })""")
        assert fits and all(ok and above and halo for _, ok, above, halo in fits), [f for f in fits if not all(f[1:])]
        # the timeline fills the page's width and its last axis label is whole
        tl = await page.evaluate("""(() => { const s = document.getElementById('s0-timeline'), r = s.getBoundingClientRect();
            const ticks = s.querySelectorAll('text.tick'), last = ticks[ticks.length - 1].getBoundingClientRect();
            return [r.width, s.parentElement.getBoundingClientRect().width, last.right, r.right]; })()""")
        assert tl[0] >= 0.95 * tl[1] - 64 and tl[2] <= tl[3], tl
        stall = await page.evaluate("(() => { const b = document.querySelector('#s0-stall rect').getBBox();"
                                    " return [b.width, b.height, document.querySelector('#s0-stall').textContent]; })()")
        assert stall[0] > 100 and stall[1] > 10 and "stall: no progress" in stall[2]
        # an evidence link of the root cause jumps to its frame and opens it
        first = await page.evaluate("document.querySelector('[data-code=missing_stream_close] a.evidence-link')"
                                    ".getAttribute('href').slice(1)")
        await _click(page, "[data-code=missing_stream_close] a.evidence-link")
        await _wait(page, _FRAME_SHOWN.format(id=first), f"frame {first} opened and on screen")
        # an arrow of the diagram does the same: the stalled heartbeats' first frame
        target = await page.evaluate("document.querySelector('#s0-sequence a.stall-row').getAttribute('href').slice(1)")
        await _click(page, "#s0-sequence a.stall-row text.label")
        await _wait(page, _FRAME_SHOWN.format(id=target), f"frame {target} opened and on screen")
        tree = await page.evaluate(f"document.getElementById({target!r}).innerText")
        assert "heartbeat" in tree
        # nothing was fetched but the file itself
        assert page.requests and set(page.requests) == {url}, page.requests
        shot = tmp_path / "report.png"
        await page.screenshot(shot)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        await page.close()
    finally:
        browser.close()
