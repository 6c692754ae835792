"""The capture writer process: ``python -m workbench.capture.child FD`` (started by ``process.py``).

Reads pickled batches of proxy events from the socket ``FD`` and feeds them, whole, to an ordinary
``CaptureWriter`` composed with ``NoPacing`` (it has a GIL of its own) and ``Confirmations``: before
each commit it sends the checkpoint a successor would go on from (``resume.py``), after it the
confirmation of the last batch handled, with the sink's counters. A successor started after a crash
gets the dead one's checkpoints with its configuration and says which batch it goes on after.
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
from typing import Any

from workbench.capture import resume
from workbench.capture.pacing import NoPacing
from workbench.capture.writer import Batch, CaptureWriter
from workbench.decode.classify import Decoder
from workbench.schema.active import schema_for_option
from workbench.schema.loader import SchemaError

# Recording is background work: when the CPUs are all busy (a flood on a small machine), the
# processes that forward (mitmdump, the client, the server) go first and the writer catches up as
# soon as a CPU is free; with a CPU to spare it runs at full speed all the same. (In one process
# the GIL and ``pacing.py`` gave the event loop that precedence.) Frames are only committed later.
NICE = 10


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


class Confirmations:
    """The writer's ``CommitListener`` here: before each commit the checkpoint a successor would go
    on from (``resume.py``), after it the confirmation of the last batch handled, with the counters."""

    def __init__(self, link: _Link) -> None:
        self.link = link
        self.writer: CaptureWriter | None = None
        self._last = -1  # the mark of the last checkpoint sent

    def committing(self, mark: int) -> None:
        assert self.writer is not None
        if mark == self._last and self.writer.sink.last_pending() is None:
            return  # no batch and no frame since the last one: the checkpoint the parent holds stands
        self._last = mark
        try:
            cp: bytes | None = resume.take(self.writer)
        except Exception as exc:  # not expected: the parent then has no checkpoint for this commit
            logging.getLogger("workbench.capture").error("cursor capture: checkpoint failed: %r", exc)
            cp = None
        self.link.send(("pre", mark, cp))

    def committed(self, mark: int) -> None:
        assert self.writer is not None
        self.link.send(("ack", mark, self.writer.stats()))


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
        # ``checkpoints``: None for the first writer, else (confirmed, pending) of the one that died
        config, schema_option, checkpoints = pickle.loads(conn.recv_bytes())
        confirm = Confirmations(link)
        writer = CaptureWriter(config, Decoder(schema_for_option(schema_option)), pacer=NoPacing(), commits=confirm)
        confirm.writer = writer

        def go_on() -> None:
            resume.restore(writer, resume.choose(writer, *checkpoints))

        writer.start(go_on if checkpoints is not None else None, settle_open=checkpoints is None)
    except (SchemaError, EOFError, OSError) as exc:
        link.send(("fatal", f"the capture writer process could not start: {exc}"))
        return 2
    except Exception as exc:  # said to the parent (which falls back to a thread), not a traceback
        link.send(("fatal", f"the capture writer process could not start: {exc!r}"))
        return 1
    ident = writer.decoder.schema.identity
    link.send(("ready", ident.source, ident.hash, writer.mark))
    try:
        return _serve(conn, writer, link)
    except Exception as exc:
        logging.getLogger("workbench.capture").error("cursor capture: the writer process failed: %r", exc)
        # End as if killed: mitmdump restarts a writer that goes on from the last checkpoint and
        # is sent what this one had not confirmed. (Stopping in order would settle the open flows
        # as ended, and the successor could not go on with them.)
        os._exit(1)


def _serve(conn: Connection, writer: CaptureWriter, link: _Link) -> int:
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
        put(Batch(*msg))  # handled whole: a confirmation covers whole batches
    writer.stop()
    link.send(("final", writer.stats()))
    conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
