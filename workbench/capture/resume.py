"""A restarted writer process goes on where the one that died stopped (``process.py``).

Before each commit the writer process takes a ``Checkpoint``: the state a successor needs to handle
the batches that come after the last one it handled (``mark``), namely the open flows (without
their stream decoders, which hold the schema's classes, but with the bytes of the partial frame each
decoder holds), the BidiAppend ordering windows, the live Run ids and refused appends, and the
sink's counters. The parent keeps the checkpoint of the last confirmed commit and the one of the
commit under way. A successor opens the database without settling the open sessions, asks it
whether that last commit happened (its last frame is stored, ``probe``), restores the matching
checkpoint, and says which batch it goes on after; the parent then sends it every batch after that
one again. So the database holds exactly what the checkpoint's commit held, and replaying the
later batches numbers the same frames the same way: none is recorded twice. New session ids derive
from the flow (``WriterConfig.session_ns``), so a replayed flow lands in the session it had.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from workbench.capture.flows import Flow
from workbench.decode.classify import StreamDecoder

if TYPE_CHECKING:
    from workbench.capture.writer import CaptureWriter

log = logging.getLogger("workbench.capture")


@dataclass
class Checkpoint:
    mark: int = 0  # the last batch handled
    # each open flow without its decoders; per direction, what its decoder held (``_held``: the
    # bytes of a partial frame, the decoder itself when it is plain data, None when it cannot
    # cross); its BidiAppend frames already recorded, by place in ``append_frames`` → (session, seq)
    flows: list[tuple[Flow, dict[str, Any], dict[int, tuple[str, int | None]]]] = field(default_factory=list)
    live_run_ids: dict[str, str] = field(default_factory=dict)
    refused: dict[str, tuple[str, str | None, str]] = field(default_factory=dict)
    appends: tuple[Any, ...] | None = None
    probe: tuple[str, int] | None = None  # (session, seq) of the last frame of the commit it preceded
    frames: int = 0   # the sink's counters then (committed: once the commit is done)
    committed: int = 0
    lost: int = 0
    held: int = 0     # frames only in the dead writer's memory (no database or spool took them)


class LostStream:
    """Stands, in a successor, for a stream decoder that could not be handed over: the rest of that
    body is not recorded, and each of its chunks is counted as lost (at least a frame or part of one)."""

    def __init__(self, count: Callable[[], None]) -> None:
        self._count = count

    def feed(self, chunk: bytes) -> list[Any]:
        if chunk:
            self._count()
        return []

    def close(self) -> list[Any]:
        return []


def _held(dec: Any) -> Any:
    """What goes in a checkpoint for one decoder: the bytes of its partial frame, the decoder itself
    when it is plain data (the OpenAI side's), or None when it cannot cross."""
    if isinstance(dec, StreamDecoder):
        return dec.unconsumed()
    if isinstance(dec, LostStream):
        return None
    try:
        pickle.dumps(dec, 5)
    except Exception:
        return None
    return dec


def take(writer: CaptureWriter) -> bytes:
    """The checkpoint of ``writer`` now (before a commit), pickled."""
    flows = []
    for fl in writer.flows.values():
        held = {d: _held(dec) for d, dec in fl.decoders.items()}
        emitted = {i: fl.append_emitted[id(f)] for i, f in enumerate(fl.append_frames) if id(f) in fl.append_emitted}
        flows.append((dataclasses.replace(fl, decoders={}, append_emitted={}), held, emitted))
    sink = writer.sink
    stats = sink.stats()
    cp = Checkpoint(writer.mark, flows, writer.live_run_ids, writer.refused, writer.appends.state(),
                    sink.last_pending(), sink.frames_total, sink.committed_after_flush(), sink.lost,
                    int(stats.get("held", 0)))
    # one pickle: a frame both in a flow and in an ordering window stays one object
    return pickle.dumps(cp, 5)


def choose(writer: CaptureWriter, confirmed: bytes | None, pending: bytes | None) -> Checkpoint:
    """The checkpoint the database matches: ``pending`` when its commit happened, else ``confirmed``."""
    if pending is not None:
        cp = pickle.loads(pending)
        if cp.probe is not None and writer.sink.has_frame(*cp.probe):
            return cp  # type: ignore[no-any-return]
    return pickle.loads(confirmed) if confirmed is not None else Checkpoint()  # type: ignore[no-any-return]


def restore(writer: CaptureWriter, cp: Checkpoint) -> None:
    """Put ``cp`` into a writer whose sink is open and whose thread has not started."""
    sink = writer.sink
    for fl, held, emitted in cp.flows:
        fo = fl.open
        for direction, what in held.items():
            if what is None:
                log.error("cursor capture: the %s body of flow %s could not be handed to the restarted writer "
                          "process: the rest of it is not recorded, each chunk counted as LOST", direction, fo.key)
                fl.decoders[direction] = LostStream(sink.count_lost)  # type: ignore[assignment]
            elif isinstance(what, bytes):
                dec = writer.decoder.stream(fo.transport, direction)
                if what:
                    dec.feed(what)  # a partial frame: nothing comes out, the decoder now holds it
                fl.decoders[direction] = dec
            else:
                fl.decoders[direction] = what
        fl.append_emitted = {id(fl.append_frames[i]): where for i, where in emitted.items()}
        writer.flows[fo.key] = fl
        if fl.session_id is not None and sink.get_session(fl.session_id) is None:
            sink.open_session(writer.session_info(fl, fl.session_id))  # the stored row, when there is one
    writer.live_run_ids.update(cp.live_run_ids)
    writer.refused.update(cp.refused)
    if cp.appends is not None:
        writer.appends.restore(cp.appends)
    writer.mark = cp.mark
    # the counters go on from the dead writer's; what only it held is lost
    sink.frames_total, sink.frames_committed = cp.frames - cp.held, cp.committed
    sink.lost += cp.lost + cp.held
    if cp.held:
        log.error("cursor capture: %d frames the writer process held in memory (no database or spool took "
                  "them) are LOST", cp.held)
