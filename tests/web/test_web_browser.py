"""``workbench web`` in a real headless Chromium: the page loads, the TUI draws the sessions list,
keys reach it, and pages of other origins or other Host names are refused.

The server is the real ``workbench web`` process, the database a real recording (conftest), the
browser Debian's ``chromium`` driven over the DevTools protocol (``web_rig``).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from web_rig import Browser, Page, WebProcess

pytestmark = pytest.mark.slow  # every test starts workbench web (and most a headless Chromium)

LABELS = ("healthy_text", "tool_flow", "heartbeat_loop", "rate_limit")


@pytest.mark.usefixtures("need_chromium")
async def test_page_shows_the_sessions_list_and_keys_reach_the_tui(web_demo_db: Path, tmp_path: Path) -> None:
    server = WebProcess(web_demo_db)
    browser = Browser()
    try:
        page = await browser.page()
        await page.navigate(server.url)
        # the sessions screen with the recorded sessions, each under its scenario label, and the
        # root cause of the heartbeat loop as its top finding
        await page.wait_for_text("4 of 4 sessions", *LABELS, "missing_stream_close")
        assert page.ws_statuses == [101]
        shot = tmp_path / "web-sessions.png"
        await page.screenshot(shot)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
        # typing in the page drives the TUI: filter the list, open the session
        await page.focus_terminal()
        await page.type("/")
        await page.wait_for_text("filter sessions (any column)")
        await page.type("heartbeat")
        await page.wait_for_text('filter "heartbeat"', "1 of 4 sessions")
        mark = len(page.received)
        await page.press_enter()  # leaves the filter box: the list has the keys again
        # wait until the footer shows the list's own keys (the filter box hides s/r/q): an Enter
        # sent before the focus moved would go to the filter box again (seen on a loaded machine)
        await page.wait_for_text("s Sort r Reverse", since=mark)
        mark = len(page.received)
        await page.press_enter()  # opens the selected session
        await page.wait_for_text("heartbeats over", "Findings", since=mark)
        await page.close()
    finally:
        browser.close()
        assert server.stop() in (0, -2)


async def _ws_status(url: str, origin: str | None, host: str | None = None) -> int:
    headers = {k: v for k, v in (("Origin", origin), ("Host", host)) if v is not None}
    async with aiohttp.ClientSession() as http:
        try:
            async with http.ws_connect(f"{url.replace('http', 'ws', 1)}/ws?width=80&height=24",
                                       headers=headers) as ws:
                await ws.close()
                return 101
        except aiohttp.WSServerHandshakeError as exc:
            return exc.status


async def test_host_and_origin_are_checked(web_demo_db: Path) -> None:
    server = WebProcess(web_demo_db)
    try:
        port = server.url.rsplit(":", 1)[1]
        async with aiohttp.ClientSession() as http:
            async with http.get(server.url + "/") as r:
                assert r.status == 200
                assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"]
            async with http.get(server.url + "/", headers={"Host": f"localhost:{port}"}) as r:
                assert r.status == 200
            async with http.get(server.url + "/", headers={"Host": f"evil.example:{port}"}) as r:
                assert r.status == 403 and "DNS rebinding" in (await r.json())["error"]
        # the page's own origin may open the TUI's websocket, under either loopback name
        assert await _ws_status(server.url, server.url) == 101
        assert await _ws_status(server.url, f"http://localhost:{port}") == 101
        assert await _ws_status(server.url, "http://evil.example") == 403
        assert await _ws_status(server.url, f"http://127.0.0.1:{int(port) + 1}") == 403
    finally:
        server.stop()


@pytest.mark.usefixtures("need_chromium")
async def test_browser_pages_of_other_origins_and_rebound_names_are_refused(web_demo_db: Path) -> None:
    """In the browser itself: a page of another origin cannot open the TUI's websocket, and a page
    that reaches the server under a rebound name (evil.example → 127.0.0.1) gets 403."""
    server = WebProcess(web_demo_db)
    port = int(server.url.rsplit(":", 1)[1])

    async def evil_page(_: web.Request) -> web.Response:
        script = (f"<script>window.result = new Promise(done => {{ const ws = new WebSocket("
                  f"'ws://127.0.0.1:{port}/ws?width=80&height=24'); ws.onopen = () => done('open'); "
                  f"ws.onerror = () => done('refused'); }});</script>")
        return web.Response(text=f"<html><body>{script}</body></html>", content_type="text/html")

    evil = web.Application()
    evil.router.add_get("/", evil_page)
    runner = web.AppRunner(evil)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    evil_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    browser = Browser(extra=["--host-resolver-rules=MAP evil.example 127.0.0.1"])
    try:
        page = await browser.page()
        await page.navigate(f"http://evil.example:{evil_port}/")
        assert await _settled(page, "window.result") == "refused"
        # DNS rebinding: the workbench page under a name that now resolves to loopback
        await page.navigate(f"http://evil.example:{port}/")
        text = await _settled(page, "document.body ? document.body.innerText : ''")
        assert "DNS rebinding" in text
        assert page.received == b""  # no TUI was ever drawn for these pages
        await page.close()
    finally:
        browser.close()
        await runner.cleanup()
        server.stop()


async def _settled(page: Page, expression: str, timeout: float = 30) -> object:
    """The expression's value once the page gives a non-empty one (it loads asynchronously)."""
    deadline = time.monotonic() + timeout
    value = await page.evaluate(expression)
    while not value and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        value = await page.evaluate(expression)
    return value


def test_web_cli_errors_name_the_problem(tmp_path: Path, web_demo_db: Path) -> None:
    exe = Path(sys.executable).parent / "workbench"
    r = subprocess.run([str(exe), "web", "--db", str(tmp_path / "none.duckdb"), "--port", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "none.duckdb: no such capture database" in r.stderr
    r = subprocess.run([str(exe), "web", "--db", str(web_demo_db), "--port", "70000"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--port must be 0…65535, not 70000" in r.stderr
    damaged = tmp_path / "damaged.duckdb"
    damaged.write_bytes(b"not a database at all" * 100)
    r = subprocess.run([str(exe), "web", "--db", str(damaged), "--port", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "damaged.duckdb" in r.stderr and "Traceback" not in r.stderr


# Every host name but loopback resolves to nothing: the machine is offline for this browser.
OFFLINE = "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"


@pytest.mark.usefixtures("need_chromium")
async def test_page_works_offline_and_asks_nothing_of_another_host(web_demo_db: Path) -> None:
    """The UI draws with the network blocked, every request the page makes stays on 127.0.0.1,
    and its terminal font is the one the server serves (textual-serve's page linked a web font)."""
    server = WebProcess(web_demo_db)
    browser = Browser(extra=[OFFLINE])
    try:
        async with aiohttp.ClientSession() as http, http.get(server.url + "/") as r:
            html = await r.text()
        assert "fonts.googleapis" not in html and "//fonts." not in html
        page = await browser.page()
        await page.navigate(server.url)
        await page.wait_for_text("4 of 4 sessions", *LABELS)
        fonts = await _settled(page, "document.fonts.ready.then(() => [...document.fonts]"
                                     ".filter(f => f.status === 'loaded').map(f => f.family))")
        assert fonts and any("Roboto Mono" in str(f) for f in fonts)  # type: ignore[union-attr]
        local = (server.url + "/", server.url.replace("http://", "ws://", 1) + "/", "data:")
        assert page.requests, "the page made no request at all: the recorder is broken"
        assert [u for u in page.requests if not u.startswith(local)] == []
        assert any("/static/fonts/RobotoMono" in u for u in page.requests)
        await page.close()
    finally:
        browser.close()
        server.stop()
