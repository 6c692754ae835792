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

Nothing is lost quietly: after each commit the child confirms the last batch whose frames are
settled (committed or spooled) with its counters. If the child dies, the frames it held and every
data event handed over since its last confirmation (and any after its death) are counted as lost,
loudly, and the addon makes mitmdump exit non-zero as for any lost frame. ``stop`` drains the
queue, sends a stop and waits for the child's final counters. The child ignores SIGINT/SIGTERM
(a Ctrl-C reaches the whole process group; mitmdump's shutdown stops it in order) and ends when
its socket reaches EOF, i.e. when mitmdump has gone, even by ``kill -9``, after finishing what it
received.
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
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from workbench.capture.flows import Body, Chunk, Event, Stop
from workbench.capture.writer import WriterConfig
from workbench.decode.classify import Decoder

log = logging.getLogger("workbench.capture")

SEND_INTERVAL = 0.005  # seconds between the sender's looks at the queue while traffic flows
QUIET_TICKS = 20       # empty looks after which it blocks on the queue instead (0.1 s without traffic)
BATCH_MAX = 4096       # events per batch at most
READY_TIMEOUT = 120.0  # seconds for the child to import, open the database and say it is ready


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

    def __init__(self, config: WriterConfig, schema_option: str, decoder: Decoder) -> None:
        self.config = config
        self.schema_option = schema_option
        self.decoder = decoder  # the parent's: the log line and the contentview; the child builds its own
        self.queue: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.pid: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._unconfirmed: dict[int, int] = {}  # batch number → data events in it, until confirmed
        self._stats: dict[str, Any] = {}
        self._final: dict[str, Any] | None = None
        self._dead = False
        self._lost_after = 0  # data events that came after the child died
        self._crash_lost = 0
        self._dropped = 0  # data events of a batch that could not be pickled
        self._status: int | None = None
        self._finished = threading.Event()
        self._sender = threading.Thread(target=self._send_loop, name="workbench-capture-sender", daemon=True)
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
        """Frames that are in neither the database nor a spool file; after the child died, also
        the data events (chunks, bodies) it had not confirmed or never got: at least one frame each
        or part of one."""
        with self._lock:
            if self._final is not None:
                return int(self._final.get("lost", 0)) + self._dropped
            if self._dead:
                return self._crash_lost + self._lost_after + self._dropped
            return int(self._stats.get("lost", 0)) + self._dropped

    @property
    def failed(self) -> str | None:
        """Why the recording stopped before ``stop`` (the child died), for the addon's exit report."""
        if not self._dead:
            return None
        return (f"the capture writer process (pid {self.pid}) ended unexpectedly (status {self._status}): "
                f"{self.lost:,} frames LOST (what it held uncommitted, the chunks handed over that it had "
                "not confirmed, and every chunk that came after)")

    def stats(self) -> dict[str, Any]:
        return dict(self._final or self._stats)

    # lifecycle -----------------------------------------------------------------------------------

    def start(self, spawned: Spawned | None = None) -> None:
        """Start the child (or take one ``spawned`` earlier), hand it its configuration and wait
        until it holds the database; ``WriterProcessError`` when it cannot."""
        child = spawned or spawn()
        self._proc, self._conn, self.pid = child.proc, child.conn, child.proc.pid
        try:
            msg = self._handshake()
        except WriterProcessError:
            child.close()
            raise
        if msg[2] != self.decoder.schema.identity.hash:
            log.warning("cursor capture: the writer process decodes with schema %s (hash %s), not %s",
                        msg[1], msg[2], self.decoder.schema.identity.hash)
        self._receiver.start()
        self._sender.start()

    def _handshake(self) -> tuple[Any, ...]:
        assert self._conn is not None and self._proc is not None
        try:
            self._send(pickle.dumps((self.config, self.schema_option)))
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
            else:
                return tuple(msg)  # ("ready", schema source, schema hash)

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
        if self._conn is not None:
            self._conn.close()

    # parent threads ------------------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        assert self._conn is not None
        with self._send_lock:
            self._conn.send_bytes(data)

    def _send_loop(self) -> None:
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
            while len(batch) < BATCH_MAX:
                try:
                    batch.append(get_nowait())
                except queue.Empty:
                    break
            if not batch:
                quiet += 1
                continue
            quiet = 0
            if type(batch[-1]) is Stop or any(type(ev) is Stop for ev in batch):
                stop = True
                batch = [ev for ev in batch if type(ev) is not Stop]
            data = sum(1 for ev in batch if (type(ev) is Chunk and ev.data) or type(ev) is Body)
            number += 1
            with self._lock:
                if self._dead:
                    self._lost_after += data
                    continue
                self._unconfirmed[number] = data
            try:
                payload = dumps((number, batch), 5)
            except Exception as exc:  # not expected (our own event types); never let the thread die
                with self._lock:
                    del self._unconfirmed[number]
                    self._dropped += data
                log.error("cursor capture: a batch of %d events could not be handed to the writer process "
                          "(%r): %d chunks LOST", len(batch), exc, data)
                payload = dumps((number, []), 5)
            try:
                self._send(payload)
                if stop:
                    self._send(dumps(None))
            except OSError:
                self._child_gone()

    def _recv_loop(self) -> None:
        assert self._conn is not None
        recv = self._conn.recv_bytes
        while True:
            try:
                msg = pickle.loads(recv())
            except (EOFError, OSError):
                break
            except Exception as exc:  # not expected from our own child: treat it as gone
                log.error("cursor capture: unreadable message from the writer process: %r", exc)
                break
            kind = msg[0]
            if kind == "ack":
                with self._lock:
                    for n in [n for n in self._unconfirmed if n <= msg[1]]:
                        del self._unconfirmed[n]
                    self._stats = msg[2]
            elif kind == "log":
                log.log(msg[1], msg[2])
            elif kind == "final":
                self._final = msg[1]
                self._finished.set()
                return
        self._child_gone()
        self._finished.set()

    def _child_gone(self) -> None:
        with self._lock:
            if self._dead or self._final is not None:
                return
            self._dead = True
            pending = sum(self._unconfirmed.values())
            self._unconfirmed.clear()
            # lost already, held in its memory (no database or spool took them), not confirmed
            self._crash_lost = int(self._stats.get("lost", 0)) + int(self._stats.get("held", 0)) + pending
        if self._proc is not None:
            try:
                self._status = self._proc.wait(5)
            except subprocess.TimeoutExpired:  # its socket broke but it lives on: it must not write on
                self._proc.kill()
                self._status = self._proc.wait()
        msg = (f"the capture writer process (pid {self.pid}) ended unexpectedly (status {self._status}): "
               f"{self._crash_lost:,} frames LOST so far (what it held uncommitted and the chunks handed over "
               "that it had not confirmed); mitmdump goes on proxying, but records nothing more")
        log.error("cursor capture: %s", msg)
        print(f"workbench capture: ERROR: {msg}", file=sys.stderr, flush=True)
