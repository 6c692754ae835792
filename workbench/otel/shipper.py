"""``workbench capture --otlp URL``: each session sent as a trace once it ended and was analysed.

It runs in the ``workbench capture`` process, beside mitmdump rather than inside it, and reads the
database the way any reader does (the capture's live read service while it runs, the file after),
so it can neither slow the proxy nor block the recording. A backend that is down or refuses is
retried with a growing wait (1 s doubling to a minute) and said once per outage on stderr; it is
never fatal. What is still unsent when the capture stops is tried once more, then named.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Mapping

from workbench.otel.export import export_sessions
from workbench.otel.sender import OtlpError, Sender
from workbench.store.connection import StoreError

POLL_S = 2.0
MAX_WAIT_S = 60.0


class OtlpShipper:
    def __init__(self, db: str, url: str | None, headers: Mapping[str, str] | None = None, *,
                 poll_s: float = POLL_S, content: bool = False) -> None:
        self.db = db
        self.sender = Sender(url, headers)
        self.poll_s = poll_s
        self.content = content
        self.sent: set[str] = set()
        self.before = set(self._ended(analysed=False))  # what the file held before this capture
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otlp-shipper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, final_timeout_s: float = 30.0) -> list[str]:
        """Stop polling, send what ended meanwhile (the capture has stopped: the file is free), and
        return the sessions that could not be sent."""
        self._stop.set()
        self._thread.join(final_timeout_s)
        deadline = time.monotonic() + final_timeout_s
        left: list[str] = []
        while time.monotonic() < deadline:
            left = self._due()
            if not left or self._ship(left):
                left = self._due()
                break
            time.sleep(1.0)
        self.sender.close()
        if left:
            print(f"workbench capture: --otlp: {len(left)} session(s) not sent to {self.sender.endpoint}: "
                  f"send them later with: workbench export --otlp URL --session ID", file=sys.stderr, flush=True)
        return left

    def _run(self) -> None:
        wait = self.poll_s
        while not self._stop.wait(wait):
            due = self._due()
            if not due or self._ship(due):
                wait = self.poll_s
            else:
                wait = min(MAX_WAIT_S, max(1.0, wait * 2))

    def _ship(self, due: list[str]) -> bool:
        from workbench.store.reader import open_reader  # the live service while mitmdump runs

        try:
            reader = open_reader(self.db)
        except StoreError:  # the file between the capture's end and its release: try again later
            return False
        try:
            done = export_sessions(reader, due, self.sender, content=self.content)
            self.sent.update(done.sessions)
        except StoreError:  # the live service went away mid-read (the capture is stopping): next time
            return False
        except OtlpError as exc:
            if self.failures == 0:
                print(f"workbench capture: WARNING: --otlp: {exc}; retrying", file=sys.stderr, flush=True)
            self.failures += 1
            return False
        finally:
            reader.close()
        if self.failures:
            print(f"workbench capture: --otlp: sending again after {self.failures} failed attempt(s)",
                  file=sys.stderr, flush=True)
            self.failures = 0
        return True

    def _due(self) -> list[str]:
        """Sessions of this capture that ended and whose findings are stored, not sent yet."""
        return [s for s in self._ended(analysed=True) if s not in self.sent and s not in self.before]

    def _ended(self, *, analysed: bool) -> list[str]:
        """Sessions that are not open (and, with ``analysed``, whose findings are stored)."""
        from workbench.analysis.stamp import stamps  # the analysis stamp: findings stored
        from workbench.store import otel_reads
        from workbench.store.reader import open_reader

        try:
            reader = open_reader(self.db)
        except StoreError:  # no file yet, or held between two readers: nothing to say yet
            return []
        try:
            ended = otel_reads.sessions_since(reader, None)
            if not analysed:
                return ended
            have = stamps(reader, ended)
            return [s for s in ended if s in have]
        except StoreError:  # the live service went away mid-read (the capture is stopping): next time
            return []
        finally:
            reader.close()
