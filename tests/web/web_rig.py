"""Drive a real headless Chromium over the DevTools protocol, for the ``workbench web`` tests.

``Browser`` starts Debian's ``chromium`` headless with its own profile and a DevTools port,
``Page`` talks to one tab over the DevTools websocket (aiohttp's client): navigate, wait for text,
evaluate, take a screenshot. The page of ``workbench web`` draws the TUI on a canvas (xterm.js), so
its text is not in the DOM: ``Page.terminal_text`` reads what the server sent down the page's
websocket (``Network.webSocketFrameReceived``: binary frames carry the terminal output, text frames
JSON control messages), with the terminal escape sequences stripped.

Also a script: ``python tests/web/web_rig.py --db captures/demo.duckdb --out docs/screenshots/web-sessions.png``
serves the database and saves a screenshot of the sessions screen.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--mute-audio", "--no-default-browser-check")
_ESC = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def require_chromium() -> str:
    """Debian's chromium, for a browser test: a skip on a developer's machine without it, a failure in CI."""
    import pytest

    path = chromium_path()
    if path is None:
        if os.environ.get("CI"):  # .ci/run installs it: a missing browser there is a failure, not a skip
            pytest.fail("Debian's chromium is not installed; .ci/run should have installed it")
        pytest.skip("Debian's chromium is not installed (.ci/run installs it: apt-get install -y chromium)")
    return path


def plain(text: str) -> str:
    """Terminal output without escape sequences (cursor moves become gaps)."""
    return _ESC.sub(" ", text)


class Browser:
    def __init__(self, width: int = 1400, height: int = 900, extra: Sequence[str] = ()) -> None:
        exe = chromium_path()
        if exe is None:
            raise RuntimeError("chromium is not installed (apt-get install -y chromium)")
        self.profile = tempfile.mkdtemp(prefix="wb-chromium-")
        self.proc = subprocess.Popen(
            [exe, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-port=0",
             "--remote-debugging-address=127.0.0.1", f"--window-size={width},{height}", *extra, "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.port = self._devtools_port()

    def _devtools_port(self, timeout: float = 60) -> int:
        marker = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode}")
            if marker.exists():
                first = marker.read_text().splitlines()[:1]
                if first and first[0].strip().isdigit():
                    return int(first[0])
            time.sleep(0.05)
        raise RuntimeError("chromium did not open its DevTools port")

    async def page(self) -> Page:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{self.port}/json/list") as r:
                targets = await r.json()
        target = next(t for t in targets if t.get("type") == "page")
        page = Page(target["webSocketDebuggerUrl"])
        await page.open()
        return page

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


class Page:
    def __init__(self, ws_url: str) -> None:
        self.ws_url = ws_url
        self._id = 0
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.received = bytearray()          # terminal bytes the page's websocket brought
        self.ws_statuses: list[int] = []     # handshake statuses of the page's websockets
        self.requests: list[str] = []        # every URL the page asked for (Network.requestWillBeSent)
        self.changed = asyncio.Event()

    async def open(self) -> None:
        self._session = aiohttp.ClientSession()
        self._ws = await self._session.ws_connect(self.ws_url, max_msg_size=0)
        self._reader = asyncio.create_task(self._read())
        await self.call("Network.enable")
        await self.call("Page.enable")

    async def _read(self) -> None:
        async for msg in self._ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            data = json.loads(msg.data)
            if "id" in data:
                fut = self._waiting.pop(data["id"], None)
                if fut is not None and not fut.done():
                    fut.set_result(data)
                continue
            method, params = data.get("method"), data.get("params", {})
            if method == "Network.requestWillBeSent":
                self.requests.append(str(params.get("request", {}).get("url")))
            elif method == "Network.webSocketFrameReceived":
                resp = params["response"]
                if resp.get("opcode") == 2:  # binary: the terminal output (text frames are control)
                    self.received += base64.b64decode(resp["payloadData"])
                    self.changed.set()
            elif method == "Network.webSocketHandshakeResponseReceived":
                self.ws_statuses.append(int(params["response"]["status"]))
                self.changed.set()

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[self._id] = fut
        await self._ws.send_str(json.dumps({"id": self._id, "method": method, "params": params}))
        answer = await asyncio.wait_for(fut, 60)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return dict(answer.get("result", {}))

    async def navigate(self, url: str) -> None:
        await self.call("Page.navigate", url=url)

    def terminal_text(self, since: int = 0) -> str:
        return plain(self.received[since:].decode("utf-8", "replace"))

    async def wait_for_text(self, *needles: str, timeout: float = 90, since: int = 0) -> str:
        """Wait until every needle has been drawn on the page's terminal (after byte ``since`` of
        what it received); returns the text."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.terminal_text(since)
            squashed = re.sub(r"\s+", " ", text)
            if all(n in squashed for n in needles):
                return text
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"page never showed {[n for n in needles if n not in squashed]}; "
                                     f"last text: {squashed[-2000:]!r}")
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), min(left, 1.0))
            except TimeoutError:
                pass

    async def focus_terminal(self) -> None:
        """Keys go to the terminal's input element (xterm.js reads them there)."""
        await self.evaluate("document.querySelector('.xterm-helper-textarea').focus()")

    async def type(self, text: str) -> None:
        """Type characters one key at a time, as a keyboard does."""
        for ch in text:
            await self.call("Input.dispatchKeyEvent", type="keyDown", key=ch, text=ch)
            await self.call("Input.dispatchKeyEvent", type="keyUp", key=ch)

    async def press_down(self) -> None:
        await self.call("Input.dispatchKeyEvent", type="keyDown", key="ArrowDown", code="ArrowDown",
                        windowsVirtualKeyCode=40)
        await self.call("Input.dispatchKeyEvent", type="keyUp", key="ArrowDown", code="ArrowDown",
                        windowsVirtualKeyCode=40)

    async def press_enter(self) -> None:
        await self.call("Input.dispatchKeyEvent", type="keyDown", key="Enter", code="Enter",
                        windowsVirtualKeyCode=13, text="\r")
        await self.call("Input.dispatchKeyEvent", type="keyUp", key="Enter", code="Enter", windowsVirtualKeyCode=13)

    async def evaluate(self, expression: str) -> Any:
        res = await self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        return res.get("result", {}).get("value")

    async def screenshot(self, path: Path) -> None:
        res = await self.call("Page.captureScreenshot", format="png")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(res["data"]))

    async def close(self) -> None:
        await self._ws.close()
        self._reader.cancel()
        await self._session.close()


class WebProcess:
    """``workbench web`` as a child process; ``url`` is the line it prints first."""

    def __init__(self, db: Path, *extra: str) -> None:
        exe = Path(sys.executable).parent / "workbench"
        self.proc = subprocess.Popen([str(exe), "web", "--db", str(db), "--port", "0", *extra],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http://"):
            err = self.proc.stderr.read() if self.proc.stderr else ""
            self.stop()
            raise RuntimeError(f"workbench web did not start: {self.url!r} {err}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)


async def shoot(db: Path, out: Path, needles: Sequence[str], down: int = 0, then: Sequence[str] = ()) -> None:
    web = WebProcess(db)
    browser = Browser()
    try:
        page = await browser.page()
        await page.navigate(web.url)
        await page.wait_for_text(*needles)
        if down:
            await page.focus_terminal()
            mark = len(page.received)
            for _ in range(down):
                await page.press_down()
            await page.wait_for_text(*then, since=mark)
        await asyncio.sleep(1.0)  # let the canvas draw the last frame it received
        await page.screenshot(out)
        await page.close()
    finally:
        browser.close()
        web.stop()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--db", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=Path("docs/screenshots/web-sessions.png"))
    ap.add_argument("--wait-for", action="append", default=[], help="text to wait for (repeatable)")
    ap.add_argument("--down", type=int, default=0, help="then move the cursor down this many rows")
    ap.add_argument("--then", action="append", default=[], help="and wait for this text (repeatable)")
    args = ap.parse_args(argv)
    asyncio.run(shoot(args.db, args.out, args.wait_for or ["sessions sorted by"], args.down, args.then))
    print(args.out)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
