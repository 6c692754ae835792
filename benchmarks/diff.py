"""`workbench diff A B` on long sessions: time and peak RSS at 10k, 200k and 1M frames.

Generates, in a fresh DuckDB file through the real classifier and FrameBatch inserts, one long
agent run (the model steps of ``diagnose.py``: deltas, a streamed tool call with its exec, result
and stream_close, KV blobs, heartbeats; ~210 frames a step) and three others that differ from it:

- ``changed exec``: the exec of the middle step runs another command;
- ``moved step``: the two middle steps swapped;
- ``stall``: the last tenth of the run replaced by an exec never closed and heartbeats (a parked run).

Then, per size and case (``equal`` is the run against itself, as ``workbench diff A A``), what the
command does in-process — read both sessions (``report.session.load_session``: frames, redaction,
analysis), compare (``sessiondiff.compare.diff_sessions``), write the text — and, as the baseline
measured in the same round, reading the same frames alone (``queries.frames_shown_whole``, both
sessions). Paired rounds (``--rounds``, default 3): baseline then diff, each round; the figures are
medians. Each size runs in its own process, so its peak RSS (``ru_maxrss``) is its own; the
baseline's peak is measured in another process. The machine's yardstick (``yardstick.py``) last.

    python benchmarks/diff.py [--sizes 10000,200000,1000000] [--rounds 3] [--cases equal,stall] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from diagnose import _client, _server, _update, step_frames

from workbench.decode.classify import Frame
from workbench.schema import pb
from workbench.store.db import FrameBatch, SessionInfo, Store, us_to_datetime

CASES = ("equal", "changed exec", "moved step", "stall")
SIDS = {"equal": "a", "changed exec": "changed", "moved step": "moved", "stall": "stall"}


def _steps(frames: int) -> list[list[tuple[str, Frame]]]:
    out: list[list[tuple[str, Frame]]] = []
    n = 1
    k = 0
    while n < frames - 2:
        step = step_frames(k)
        out.append(step)
        n += len(step)
        k += 1
    return out


def _changed(step: list[tuple[str, Frame]], k: int) -> list[tuple[str, Frame]]:
    other = _server(exec_server_message=pb.ExecServerMessage(
        id=k + 1, exec_id=f"x{k}", shell_args=pb.ShellArgs(command="rm -rf build", tool_call_id=f"call-{k}")))
    return [(d, other if f.kind == "exec_server_message.shell_args" else f) for d, f in step]


def _write(batch: FrameBatch, store: Store, sid: str, frames: list[tuple[str, Frame]], status: str,
           parked_from: int) -> None:
    ts = t0 = 1_750_000_000_000_000
    for seq, (direction, f) in enumerate(frames):
        ts += 2_000_000 if seq >= parked_from else 2_000   # a parked run: a heartbeat every 2 s
        batch.add(sid, seq, ts, direction, "run", None, f)
        if len(batch) >= 100_000:
            store.insert_frames(batch)
            batch.clear()
    store.insert_frames(batch)
    batch.clear()
    store.upsert_sessions([SessionInfo(sid, source="benchmark", transport="run", conversation_id="bench",
                                       frame_count=len(frames), started_at=us_to_datetime(t0),
                                       ended_at=us_to_datetime(ts), status=status)])


def generate(store: Store, frames: int) -> dict[str, int]:
    """The four sessions of one size; session id → frames."""
    first = ("client", _client(run_request=pb.AgentRunRequest(
        conversation_state=pb.ConversationStateStructure(), conversation_id="bench",
        action=pb.ConversationAction(user_message_action=pb.UserMessageAction(
            user_message=pb.UserMessage(text="find every pattern"))))))
    end = [("server", _update(turn_ended=pb.TurnEnded()))]
    steps = _steps(frames)
    mid = len(steps) // 2
    sessions: dict[str, tuple[list[tuple[str, Frame]], str]] = {}
    parked_from: dict[str, int] = {}
    sessions["a"] = ([first, *(f for s in steps for f in s), *end], "complete")
    changed = [*steps[:mid], _changed(steps[mid], mid), *steps[mid + 1:]]
    sessions["changed"] = ([first, *(f for s in changed for f in s), *end], "complete")
    moved = [*steps[:mid], steps[mid + 1], steps[mid], *steps[mid + 2:]]
    sessions["moved"] = ([first, *(f for s in moved for f in s), *end], "complete")
    keep = [first, *(f for s in steps[: len(steps) * 9 // 10] for f in s)]
    eid = 10_000_000
    keep += [("server", _server(exec_server_message=pb.ExecServerMessage(
                 id=eid, exec_id="stall", shell_args=pb.ShellArgs(command="sleep 1")))),
             ("client", _client(exec_client_message=pb.ExecClientMessage(
                 id=eid, exec_id="stall", shell_result=pb.ShellResult(success=pb.ShellSuccess(stdout="")))))]
    hb = ("server", _update(heartbeat=pb.Heartbeat()))
    parked_from["stall"] = len(keep)
    keep += [hb] * max(0, len(sessions["a"][0]) - len(keep))
    sessions["stall"] = (keep, "incomplete")
    batch = FrameBatch()
    for sid, (fs, status) in sessions.items():
        _write(batch, store, sid, fs, status, parked_from.get(sid, len(fs)))
    return {sid: len(fs) for sid, (fs, _) in sessions.items()}


def _read_alone(db: str, sids: tuple[str, str]) -> int:
    from workbench.report.session import open_source
    from workbench.store import queries

    n = 0
    for sid in sids:
        with open_source(sid, db) as (src, resolved):
            for _row in queries.frames_shown_whole(src, resolved):
                n += 1
    return n


def _diff(db: str, sids: tuple[str, str]) -> tuple[int, int]:
    from workbench.report.session import load_session, open_source
    from workbench.sessiondiff.compare import diff_sessions
    from workbench.sessiondiff.render import human

    views = []
    for sid in sids:
        with open_source(sid, db) as (src, resolved):
            views.append(load_session(src, resolved))
    d = diff_sessions(views[0], views[1])
    human(d)
    return len(d.differences), d.work


def child(db: str, mode: str, rounds: int, cases: list[str]) -> None:
    """One size in this process: paired rounds per case (``mode`` diff), or the read alone (``read``)."""
    out: dict[str, Any] = {}
    _read_alone(db, ("a", "a"))   # imports and the file's first open, outside the rounds
    for case in cases:
        sids = ("a", SIDS[case])
        bases, tooks = [], []
        diffs = work = 0
        for _ in range(rounds):
            t = time.perf_counter()
            _read_alone(db, sids)
            bases.append(time.perf_counter() - t)
            if mode == "diff":
                t = time.perf_counter()
                diffs, work = _diff(db, sids)
                tooks.append(time.perf_counter() - t)
        out[case] = {"base": statistics.median(bases), "took": statistics.median(tooks) if tooks else None,
                     "differences": diffs, "work": work}
    out["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))


def _run_child(db: Path, mode: str, rounds: int, cases: list[str]) -> dict[str, Any]:
    p = subprocess.run([sys.executable, __file__, "--child", mode, "--db", str(db), "--rounds", str(rounds),
                        "--cases", ",".join(cases)],
                       capture_output=True, text=True, check=False)
    if p.returncode:
        raise SystemExit(f"{mode} at {db} failed:\n{p.stderr}")
    return dict(json.loads(p.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10000,200000,1000000")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", default=",".join(CASES), help=f"some of: {', '.join(CASES)}")
    ap.add_argument("--keep", action="store_true", help="keep the temporary databases")
    ap.add_argument("--child", choices=["diff", "read"], help=argparse.SUPPRESS)
    ap.add_argument("--db", help=argparse.SUPPRESS)
    args = ap.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    if unknown := set(cases) - set(CASES):
        ap.error(f"--cases: unknown {', '.join(sorted(unknown))} (choose from {', '.join(CASES)})")
    if args.child:
        child(args.db, args.child, max(1, args.rounds), cases)
        return
    tmp = Path(tempfile.mkdtemp(prefix="wb-bench-diff-"))
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            db = tmp / f"diff-{size}.duckdb"
            t0 = time.perf_counter()
            with Store(db) as store:
                counts = generate(store, size)
                store.checkpoint()
            print(f"\n{size:,} frames: generated {sum(counts.values()):,} frames in 4 sessions in "
                  f"{time.perf_counter() - t0:.1f} s")
            got = _run_child(db, "diff", args.rounds, cases)
            read = _run_child(db, "read", 1, cases[:1])
            print(f"  medians of {args.rounds} paired rounds; peak RSS: diff {got['rss_mib']:.0f} MiB, "
                  f"reading the frames alone {read['rss_mib']:.0f} MiB")
            for case in cases:
                r = got[case]
                print(f"  {case:<13} diff {r['took']:7.3f} s   read alone {r['base']:7.3f} s   "
                      f"{r['took'] / r['base']:5.1f}x   {r['differences']} differences, work {r['work']:,}")
            if not args.keep:
                db.unlink()
    finally:
        if not args.keep:
            for extra in tmp.iterdir():
                extra.unlink()
            tmp.rmdir()
    from yardstick import measure  # the machine's yardstick (benchmarks/yardstick.py), run after the figures

    print(measure().line())
    print(f"(load average {os.getloadavg()[0]:.1f} at the end)")


if __name__ == "__main__":
    main()
