"""The capture writer process: ``python -m workbench.capture.child FD`` (started by ``process.py``).

Reads pickled batches of proxy events from the socket ``FD`` and feeds them to an ordinary
``CaptureWriter``; after each commit it confirms the last batch handled, with the sink's counters.
Its log records go to the parent (mitmproxy's log). It runs at a lower priority (``NICE``). SIGINT and SIGTERM are ignored: a Ctrl-C in
the terminal reaches the whole process group, and the parent stops this process in order (a
``None`` message) once mitmdump has let go of its flows; when the parent is gone (EOF) the child
finishes what it received and exits too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

from workbench.capture.writer import CaptureWriter, Event, WriterConfig
from workbench.decode.classify import Decoder
from workbench.schema.active import schema_for_option
from workbench.schema.loader import SchemaError

# Recording is background work: when the CPUs are all busy (a flood on a small machine), the
# processes that forward (mitmdump, the client, the server) go first and the writer catches up as
# soon as a CPU is free; with a CPU to spare it runs at full speed all the same. (In one process
# the GIL and ``pacing.py`` gave the event loop that precedence.) Frames are only committed later.
NICE = 10


class Mark(NamedTuple):
    """The end of batch ``number`` in the writer's queue."""

    number: int


class _NoPacing:
    """The writer has a GIL of its own here: nothing to yield to (``pacing.py``)."""

    pauses = 0

    def begin(self) -> None:
        pass

    def step(self) -> None:
        pass


class _Link:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.lock = threading.Lock()

    def send(self, msg: Any) -> None:
        data = pickle.dumps(msg, 5)
        with self.lock:
            try:
                self.conn.send_bytes(data)
            except OSError:
                pass  # the parent is gone: the receiving loop sees EOF and ends


class _Forward(logging.Handler):
    def __init__(self, link: _Link) -> None:
        super().__init__()
        self.link = link

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
            if record.exc_info:
                msg += "\n" + logging.Formatter().formatException(record.exc_info)
            self.link.send(("log", record.levelno, msg))
        except Exception:
            self.handleError(record)


class ChildWriter(CaptureWriter):
    """A ``CaptureWriter`` that confirms, after each commit, the last batch it has handled."""

    def __init__(self, config: WriterConfig, decoder: Decoder, link: _Link) -> None:
        super().__init__(config, decoder)
        self.pacer = _NoPacing()  # type: ignore[assignment]
        self._link = link
        self._mark = 0

    def _handle(self, ev: Event) -> None:
        if type(ev) is Mark:
            self._mark = ev.number  # type: ignore[union-attr]
            return
        super()._handle(ev)

    def flush(self) -> None:
        super().flush()
        self._link.send(("ack", self._mark, self.stats()))


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].isdigit():
        print("usage: python -m workbench.capture.child FD (started by the capture addon, not by hand)",
              file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.nice(NICE)
    conn = Connection(int(argv[0]))
    link = _Link(conn)
    logger = logging.getLogger("workbench")
    logger.addHandler(_Forward(link))
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        config, schema_option = pickle.loads(conn.recv_bytes())
        writer = ChildWriter(config, Decoder(schema_for_option(schema_option)), link)
        writer.start()
    except (SchemaError, EOFError, OSError) as exc:
        link.send(("fatal", f"the capture writer process could not start: {exc}"))
        return 2
    except Exception as exc:  # said to the parent (which falls back to a thread), not a traceback
        link.send(("fatal", f"the capture writer process could not start: {exc!r}"))
        return 1
    ident = writer.decoder.schema.identity
    link.send(("ready", ident.source, ident.hash))
    try:
        return _serve(conn, writer, link)
    except Exception as exc:
        logging.getLogger("workbench.capture").error("cursor capture: the writer process failed: %r", exc)
        # Commit what it can (each commit is still confirmed), but send no final counters: the
        # parent reports the failure and counts what was not confirmed as lost.
        writer.stop()
        return 1


def _serve(conn: Connection, writer: ChildWriter, link: _Link) -> int:
    put = writer.queue.put
    loads = pickle.loads
    recv = conn.recv_bytes
    while True:
        try:
            msg = loads(recv())
        except (EOFError, OSError):
            break  # the parent is gone: finish what arrived
        if msg is None:
            break
        number, events = msg
        for ev in events:
            put(ev)
        put(Mark(number))  # type: ignore[arg-type]
    writer.stop()
    link.send(("final", writer.stats()))
    conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
