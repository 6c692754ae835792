"""The writer process's backlog: batches handed over that the child has not confirmed yet.

The sender thread (``process.py``) adds every batch here, pickled, before it goes to the child, and
keeps it until the child confirms a commit that covers it: so when the child dies, a successor is
sent every batch after the last confirmed one again (``resume.py``). The batches stay in memory up
to ``bound`` bytes; past it they go to a scratch file on disk (``spool.BatchSpool``, encrypted) instead, so a
child that falls behind (or is stopped) costs disk, not mitmdump's memory, and they are sent on from
there in order. When the disk refuses too, batches are still kept in memory up to twice the bound;
beyond that their data events are counted as lost (loudly: the capture then exits non-zero).

The transmitter thread takes the batches in order (``next_unsent``) with the connection of the child
they are for; ``attach`` gives it a new child (sending then starts again after what it confirmed),
``finish`` says the capture stops (after the last batch the child is told to end).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection

from workbench.capture.spool import BatchSpool, SpoolError

BACKLOG_MB = 256  # default bound of the batches kept in memory (cursor_backlog_mb)
END = -1          # ``next_unsent``'s number after the last batch once the capture stops


@dataclass(slots=True)
class _Entry:
    number: int
    data: int               # data events (chunks, bodies) in it: what is lost if it is
    payload: bytes | None   # in memory; None: on disk at ``offset``
    offset: int
    length: int             # of the payload in memory, of its record on disk


class Backlog:
    def __init__(self, bound: int, spool: BatchSpool, loud: Callable[[str], None],
                 note: Callable[[str], None]) -> None:
        self.bound = bound
        self._spool = spool
        self._loud, self._note = loud, note
        self._cond = threading.Condition()
        self._entries: list[_Entry] = []
        self._head = 0      # the first unconfirmed entry
        self._send_at = 0   # the next entry to send to the current child
        self._conn: Connection | None = None
        self._mem = 0
        self._on_disk = 0
        self._finished = False
        self._gave_up = False
        self._disk_said = False
        self.spooled = 0   # batches that went to disk (stats)
        self.lost = 0      # data events lost here (no memory or disk for them, or no child any more)

    # the sender's side ------------------------------------------------------------------------

    def add(self, number: int, data: int, payload: bytes) -> None:
        n = len(payload)
        with self._cond:
            if self._gave_up:
                self.lost += data
                return
            if self._mem + n <= self.bound:
                entry = _Entry(number, data, payload, 0, n)
                self._mem += n
            else:
                try:
                    entry = _Entry(number, data, None, *self._spool.append(payload))
                except SpoolError as exc:
                    if self._mem + n > 2 * self.bound:
                        self.lost += data
                        self._loud(f"{exc}; and the backlog holds {self._mem // 2**20} MiB in memory: "
                                   f"{data} chunks LOST ({self.lost:,} so far)")
                        return
                    entry = _Entry(number, data, payload, 0, n)
                    self._mem += n
                else:
                    self._on_disk += 1
                    self.spooled += 1
                    if not self._disk_said:
                        self._disk_said = True
                        self._note(f"the writer process is behind by over {self.bound // 2**20} MiB: "
                                   f"batches go to {self._spool.path} (deleted) until it catches up")
            self._entries.append(entry)
            self._cond.notify_all()

    def finish(self) -> None:
        """No batch comes after the ones added: the child is told to end after the last."""
        with self._cond:
            self._finished = True
            self._cond.notify_all()

    # the transmitter's side -------------------------------------------------------------------

    def next_unsent(self) -> tuple[Connection, int, bytes] | None:
        """(the child's connection, the batch's number, the pickled batch) of the next batch to
        send, in order; number ``END`` after the last once the capture stops; None once there is
        no child any more (``give_up``). Blocks until there is one and a child to send it to."""
        with self._cond:
            while True:
                if self._gave_up:
                    return None
                conn = self._conn
                if conn is not None:
                    if self._send_at < len(self._entries):
                        e = self._entries[self._send_at]
                        self._send_at += 1
                        payload = e.payload if e.payload is not None else self._spool.read(e.offset, e.length)
                        return conn, e.number, payload
                    if self._finished:
                        self._conn = None  # told once per child
                        return conn, END, b""
                self._cond.wait()

    # the receiver's side ----------------------------------------------------------------------

    def confirm(self, number: int) -> None:
        """The child has committed everything up to batch ``number``: let those go."""
        with self._cond:
            entries = self._entries
            head = self._head
            while head < len(entries) and entries[head].number <= number:
                e = entries[head]
                if e.payload is not None:
                    self._mem -= e.length
                else:
                    self._on_disk -= 1
                head += 1
            self._head = head
            self._send_at = max(self._send_at, head)
            if head > 1024 and head * 2 > len(entries):
                del entries[:head]
                self._send_at -= head
                self._head = 0
            if not self._on_disk and self._spool.size:
                self._spool.reset()
                if self._disk_said:
                    self._disk_said = False
                    self._note("the writer process caught up: the backlog is back in memory")

    def attach(self, conn: Connection | None) -> None:
        """Send to this child from the first unconfirmed batch on (None: no child for now)."""
        with self._cond:
            self._conn = conn
            self._send_at = self._head
            self._cond.notify_all()

    def unconfirmed(self) -> tuple[int, int]:
        """(batches, data events) not confirmed."""
        with self._cond:
            rest = self._entries[self._head:]
            return len(rest), sum(e.data for e in rest)

    def give_up(self) -> int:
        """No child any more: every unconfirmed batch, and every later one, is lost; returns the
        data events lost now."""
        with self._cond:
            _, data = len(self._entries) - self._head, sum(e.data for e in self._entries[self._head:])
            self.lost += data
            self._entries.clear()
            self._head = self._send_at = self._mem = self._on_disk = 0
            self._gave_up = True
            self._conn = None
            self._spool.close()
            self._cond.notify_all()
            return data

    def stats(self) -> dict[str, int]:
        with self._cond:
            return {"backlog_batches": len(self._entries) - self._head, "backlog_memory": self._mem,
                    "backlog_disk": self._spool.size, "backlog_spooled": self.spooled}

    def close(self) -> None:
        with self._cond:
            self._spool.close()
