"""The capture writer in a process of its own, so that recording never competes with the proxy.

Decoding, the write gate, the ``Recorder`` and DuckDB are several times the Python work that
forwarding the same bytes costs mitmproxy's event loop. In one process they share one GIL with it
(and DuckDB's Python client re-takes the GIL between its execution tasks), so under a flood the
event loop waited for the writer thread and clients got frames markedly slower than through plain
mitmdump, pacing or not (``pacing.py``). Here mitmdump's process only stamps chunks and hands
them over: ``WriterProcess`` has the interface the addon uses (``queue.put``, ``start``, ``stop``,
``lost``, ``decoder``), a sender thread batches the queued events and sends each batch pickled over
a socket pair, and a child process (``python -m workbench.capture.child``) runs an ordinary
``CaptureWriter`` with the sink, spool and live read service.

Nothing is lost quietly: every batch stays in the sender's backlog (``backlog.py``: memory up to
``cursor_backlog_mb``, then a scratch file) until the child confirms a commit that covers it. If the
child dies, it is restarted (at most ``cursor_writer_restarts`` times, waiting a little longer each
time): the successor goes on from the dead child's last checkpoint (``resume.py``) and is sent every
batch after it again, so nothing is recorded twice and nothing it had not confirmed is lost. What
cannot be replayed (frames only the dead child held in memory, every batch once no restart is
left) is counted as lost, loudly, and the addon makes mitmdump exit non-zero as for any lost frame.
``stop`` drains the queue, sends a stop and waits for the child's final counters. The child ignores
SIGINT/SIGTERM (a Ctrl-C reaches the whole process group; mitmdump's shutdown stops it in order)
and ends when its socket reaches EOF, i.e. when mitmdump has gone, even by ``kill -9``, after
finishing what it received.
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from workbench.capture.backlog import BACKLOG_MB, END, Backlog
from workbench.capture.flows import Body, Chunk, Event, Stop
from workbench.capture.sink import write_stats_file
from workbench.capture.spool import BatchSpool
from workbench.capture.writer import WriterConfig
from workbench.decode.classify import Decoder

log = logging.getLogger("workbench.capture")

SEND_INTERVAL = 0.005  # seconds between the sender's looks at the queue while traffic flows
QUIET_TICKS = 20       # empty looks after which it blocks on the queue instead (0.1 s without traffic)
BATCH_MAX = 4096       # events per batch at most
# bytes of chunks and bodies per batch at most (one event may pass it alone): a batch is pickled whole
# and held in both processes, so one long SSE line in 64 KiB chunks must not become a 200 MB batch
BATCH_BYTES = 4 * 1024 * 1024
READY_TIMEOUT = 120.0  # seconds for the child to import, open the database and say it is ready
RESTARTS = 3           # restarts of a child that died, at most (cursor_writer_restarts)
RESTART_WAIT = 0.5     # seconds before the first restart, doubled before each further one


def _size(ev: Event) -> int:
    """The bytes an event carries (a chunk's or a body's)."""
    kind = type(ev)
    return len(ev.data) if kind is Chunk else len(ev.body) if kind is Body else 0  # type: ignore[union-attr]


class WriterProcessError(RuntimeError):
    """The child process could not start (its message says why)."""


def _package_root() -> str:
    return str(Path(__file__).resolve().parents[2])


class Spawned:
    """A child process waiting for its configuration; closing its socket ends it."""

    def __init__(self, proc: subprocess.Popen[bytes], conn: Connection) -> None:
        self.proc, self.conn = proc, conn

    def close(self) -> None:
        self.conn.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def spawn() -> Spawned:
    """Start ``python -m workbench.capture.child`` on one end of a socket pair."""
    ours, theirs = socket.socketpair()
    env = dict(os.environ)
    # the workbench that runs here, also when the addon was loaded from a source checkout by path
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_package_root(), env.get("PYTHONPATH")) if p)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "workbench.capture.child", str(theirs.fileno())],
                                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=env)
    except OSError as exc:
        ours.close()
        raise WriterProcessError(f"cannot start the capture writer process: {exc}") from exc
    finally:
        theirs.close()
    return Spawned(proc, Connection(ours.detach()))


class WriterProcess:
    """A ``CaptureWriter`` in a child process, behind the interface the addon uses."""

    def __init__(self, config: WriterConfig, schema_option: str, decoder: Decoder,
                 backlog_bytes: int = BACKLOG_MB * 2**20, restarts: int = RESTARTS) -> None:
        # session ids derived from the flows: a restarted child names a replayed flow's session alike
        self.config = replace(config, session_ns=config.session_ns or str(uuid.uuid4()))
        self.schema_option = schema_option
        self.decoder = decoder  # the parent's: the log line and the contentview; the child builds its own
        self.queue: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.pid: int | None = None
        self.restarts = 0
        self.max_restarts = restarts
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._dead_conns: list[Connection] = []  # of the children that died
        self._lock = threading.Lock()
        self.backlog = Backlog(backlog_bytes, BatchSpool(config.db_path), self._loud, self._note)
        self._confirmed_cp: bytes | None = None  # checkpoint of the last confirmed commit
        self._pending_cp: tuple[int, bytes | None] | None = None  # (mark, checkpoint) of the commit under way
        self._stats: dict[str, Any] = {}
        self._final: dict[str, Any] | None = None
        self._dead = False  # no restart left
        self._statuses: list[int | None] = []  # exit statuses of the children that died
        self._dropped = 0  # data events of a batch that could not be pickled
        self._finished = threading.Event()
        self._sender = threading.Thread(target=self._send_loop, name="workbench-capture-sender", daemon=True)
        self._transmitter = threading.Thread(target=self._transmit_loop, name="workbench-capture-transmitter",
                                             daemon=True)
        self._receiver = threading.Thread(target=self._recv_loop, name="workbench-capture-receiver", daemon=True)

    # counters ------------------------------------------------------------------------------------

    @property
    def frames_total(self) -> int:
        return int((self._final or self._stats).get("frames", 0))

    @property
    def frames_committed(self) -> int:
        return int((self._final or self._stats).get("committed", 0))

    @property
    def lost(self) -> int:
        """Frames in neither the database nor a spool file (the child's count, carried over its
        restarts), and the data events (chunks, bodies: at least one frame each or part of one) that
        no child will record: once no restart is left, or when no memory or disk took them."""
        with self._lock:
            child = int((self._final or self._stats).get("lost", 0))
            if self._dead and self._final is None:
                child += int(self._stats.get("held", 0))
        return child + self.backlog.lost + self._dropped

    @property
    def failed(self) -> str | None:
        """Why the recording stopped before ``stop`` (no restart left), for the addon's exit report."""
        if not self._dead:
            return None
        return (f"the capture writer process died {len(self._statuses)} times (exit statuses "
                f"{', '.join(map(str, self._statuses))}) and was not restarted again: {self.lost:,} frames LOST "
                "(what it held uncommitted, the chunks it had not confirmed, and every chunk that came after)")

    def stats(self) -> dict[str, Any]:
        out = dict(self._final or self._stats)
        out["lost"] = self.lost
        out["writer_restarts"] = self.restarts
        out.update(self.backlog.stats())
        return out

    def _write_stats(self) -> None:
        """The counters file with what only mitmdump knows (restarts, what no child will record):
        at stop, and when no restart is left (a child writes it after each of its flushes)."""
        if self.config.stats_path:
            write_stats_file(self.config.stats_path, self.stats())

    # lifecycle -----------------------------------------------------------------------------------

    def start(self, spawned: Spawned | None = None) -> None:
        """Start the child (or take one ``spawned`` earlier), hand it its configuration and wait
        until it holds the database; ``WriterProcessError`` when it cannot."""
        msg = self._start_child(spawned or spawn(), None)
        if msg[2] != self.decoder.schema.identity.hash:
            log.warning("cursor capture: the writer process decodes with schema %s (hash %s), not %s",
                        msg[1], msg[2], self.decoder.schema.identity.hash)
        self.backlog.attach(self._conn)
        self._receiver.start()
        self._transmitter.start()
        self._sender.start()

    def _start_child(self, child: Spawned, checkpoints: tuple[bytes | None, bytes | None] | None) -> tuple[Any, ...]:
        self._proc, self._conn, self.pid = child.proc, child.conn, child.proc.pid
        try:
            return self._handshake(checkpoints)
        except WriterProcessError:
            child.close()
            raise

    def _handshake(self, checkpoints: tuple[bytes | None, bytes | None] | None) -> tuple[Any, ...]:
        assert self._conn is not None and self._proc is not None
        try:
            self._conn.send_bytes(pickle.dumps((self.config, self.schema_option, checkpoints)))
        except OSError as exc:
            raise WriterProcessError(f"the capture writer process ended at start-up ({exc})") from exc
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            if not self._conn.poll(max(0.0, deadline - time.monotonic())):
                raise WriterProcessError(f"the capture writer process did not start within {READY_TIMEOUT:.0f} s")
            try:
                msg = pickle.loads(self._conn.recv_bytes())
            except (EOFError, OSError) as exc:
                raise WriterProcessError(
                    f"the capture writer process ended at start-up (status {self._proc.wait()})") from exc
            if msg[0] == "log":
                log.log(msg[1], msg[2])
            elif msg[0] == "fatal":
                raise WriterProcessError(msg[1])
            elif msg[0] == "ready":
                return tuple(msg)  # ("ready", schema source, schema hash, the batch it goes on after)

    def stop(self, timeout: float | None = None) -> None:
        if not self._sender.is_alive() and not self._receiver.is_alive():
            return
        self.queue.put(Stop())
        self._sender.join(timeout)
        self._finished.wait(timeout)
        self._receiver.join(timeout)
        if self._proc is not None:
            try:
                self._proc.wait(timeout if timeout is not None else 60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        for conn in (self._conn, *self._dead_conns):
            if conn is not None:
                conn.close()
        self.backlog.close()
        if self.restarts or self._dead:
            self._write_stats()

    # parent threads ------------------------------------------------------------------------------

    def _send_loop(self) -> None:
        """The queue → the backlog, in batches (pickled here, off the event loop)."""
        get, get_nowait = self.queue.get, self.queue.get_nowait
        dumps = pickle.dumps
        number = 0
        stop = False
        quiet = QUIET_TICKS
        while not stop:
            batch: list[Event] = []
            if quiet >= QUIET_TICKS:
                batch.append(get())  # quiet: sleep until the next event
            # While traffic flows, look every SEND_INTERVAL instead: a thread woken by every put
            # would take the GIL from the event loop once per chunk.
            time.sleep(SEND_INTERVAL)
            held = sum(_size(ev) for ev in batch)
            while len(batch) < BATCH_MAX and held < BATCH_BYTES:
                try:
                    ev = get_nowait()
                except queue.Empty:
                    break
                batch.append(ev)
                held += _size(ev)
            if not batch:
                quiet += 1
                continue
            quiet = 0
            if type(batch[-1]) is Stop or any(type(ev) is Stop for ev in batch):
                stop = True
                batch = [ev for ev in batch if type(ev) is not Stop]
            data = sum(1 for ev in batch if (type(ev) is Chunk and ev.data) or type(ev) is Body)
            number += 1
            try:
                payload = dumps((number, batch), 5)
            except Exception as exc:  # not expected (our own event types); never let the thread die
                self._dropped += data
                log.error("cursor capture: a batch of %d events could not be handed to the writer process "
                          "(%r): %d chunks LOST", len(batch), exc, data)
                payload = dumps((number, []), 5)
            self.backlog.add(number, data, payload)
        self.backlog.finish()

    def _transmit_loop(self) -> None:
        """The backlog → the child, in order (a child that stops reading blocks only this thread)."""
        dumps = pickle.dumps
        while True:
            item = self.backlog.next_unsent()
            if item is None:
                return
            conn, number, payload = item
            try:
                conn.send_bytes(dumps(None) if number == END else payload)
            except OSError:
                pass  # the child is gone: the receiver restarts one, which is sent everything unconfirmed

    def _recv_loop(self) -> None:
        while True:
            self._receive()
            if self._final is not None or not self._restart():
                break
        self._finished.set()

    def _receive(self) -> None:
        """Read the current child's messages until it is gone or says its final counters."""
        assert self._conn is not None
        recv = self._conn.recv_bytes
        while True:
            try:
                msg = pickle.loads(recv())
            except (EOFError, OSError):
                return
            except Exception as exc:  # not expected from our own child: treat it as gone
                log.error("cursor capture: unreadable message from the writer process: %r", exc)
                return
            kind = msg[0]
            if kind == "pre":  # a commit is under way: (mark, checkpoint)
                self._pending_cp = (msg[1], msg[2])
            elif kind == "ack":
                with self._lock:
                    self._stats = msg[2]
                    if self._pending_cp is not None and self._pending_cp[0] == msg[1]:
                        self._confirmed_cp = self._pending_cp[1]
                        self._pending_cp = None
                self.backlog.confirm(msg[1])
            elif kind == "log":
                log.log(msg[1], msg[2])
            elif kind == "final":
                self._final = msg[1]
                return

    def _restart(self) -> bool:
        """The child died: start another that goes on from its last checkpoint (True), or, with no
        restart left, count everything it had not confirmed and everything after as lost (False)."""
        status = self._reap()
        self._statuses.append(status)
        self.backlog.attach(None)
        dead_pid = self.pid
        while self.restarts < self.max_restarts:
            self.restarts += 1
            batches, _ = self.backlog.unconfirmed()
            self._loud(f"the capture writer process (pid {dead_pid}) ended unexpectedly (status {status}); "
                       f"restarting it ({self.restarts} of {self.max_restarts}) to replay the {batches:,} batches "
                       "it had not confirmed; mitmdump goes on proxying meanwhile")
            time.sleep(RESTART_WAIT * 2 ** (self.restarts - 1))
            pending = self._pending_cp
            checkpoints = (self._confirmed_cp, pending[1] if pending is not None else None)
            try:
                msg = self._start_child(spawn(), checkpoints)
            except WriterProcessError as exc:
                self._loud(f"could not restart the capture writer process: {exc}")
                status = self._reap()
                continue
            base = int(msg[3])
            if pending is not None and base == pending[0]:
                self._confirmed_cp = pending[1]  # its commit happened after all
            self._pending_cp = None
            self.backlog.confirm(base)
            batches, _ = self.backlog.unconfirmed()
            self._note(f"the capture writer process runs again (pid {self.pid}); it goes on after batch {base:,} "
                       f"and is sent the {batches:,} batches after it again")
            self.backlog.attach(self._conn)
            return True
        with self._lock:
            self._dead = True
        lost = self.backlog.give_up()
        self._loud(f"the capture writer process (pid {dead_pid}) ended unexpectedly (status {status}) and no "
                   f"restart is left ({self.max_restarts} done): {self.lost:,} frames LOST so far ({lost:,} chunks "
                   "it had not confirmed); mitmdump goes on proxying, but records nothing more")
        self._write_stats()
        return False

    def _reap(self) -> int | None:
        if self._conn is not None:
            # Closed at ``stop``, not now: the transmitter may be writing to it this moment, and a
            # closed descriptor's number is soon reused by the next child's socket.
            self._dead_conns.append(self._conn)
            self._conn = None
        if self._proc is None:
            return None
        try:
            return self._proc.wait(5)
        except subprocess.TimeoutExpired:  # its socket broke but it lives on: it must not write on
            self._proc.kill()
            return self._proc.wait()

    def _loud(self, msg: str) -> None:
        log.error("cursor capture: %s", msg)
        print(f"workbench capture: ERROR: {msg}", file=sys.stderr, flush=True)

    def _note(self, msg: str) -> None:
        log.warning("cursor capture: %s", msg)
        print(f"workbench capture: {msg}", file=sys.stderr, flush=True)
